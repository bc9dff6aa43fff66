"""An executor killed mid-write under local-cluster: the job retries, the dead attempt's ledger is discarded."""
import pytest
from pyspark.sql import functions as F

from connector.client import LedgerClient, NoSuchLedgerError
from metadata.store import MetadataStore
from metadata.streams import iter_ledgers, read_stream
from tests.spark.executor_kill_job import ROWS
from tests.spark.helpers import read, run_application, stream_ledgers


@pytest.mark.timeout(900)
def test_executor_killed_mid_write(spark, shared_uri, stream, tmp_path):
    marker = tmp_path / "killed"
    run_application("tests.spark.executor_kill_job", shared_uri, stream, str(marker), log=tmp_path / "job.log",
                    timeout=720)
    dead_ledger = int(marker.read_text())
    back = read(spark, shared_uri, stream)
    assert back.count() == ROWS
    assert back.select("id").distinct().count() == ROWS
    assert back.agg(F.sum("id")).collect()[0][0] == sum(range(ROWS))
    with MetadataStore(shared_uri) as store:
        registered = sorted(s.ledger_id for s in iter_ledgers(store, read_stream(store, stream).value))
    assert dead_ledger not in registered and len(registered) == 4
    assert sorted(stream_ledgers(shared_uri, stream)) == registered
    with LedgerClient(shared_uri) as lc, pytest.raises(NoSuchLedgerError):
        lc.ledger_metadata(dead_ledger)
