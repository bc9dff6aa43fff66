"""Truncation and retention through Spark (issue 14 item 3): batch reads and streaming queries that ask for
truncated offsets get failOnDataLoss both ways, and retentionMs / retentionBytes on a write are stored in the stream
at commit, then applied by a retention run, which removes exactly the whole ledgers past the limit."""
import pytest

from connector.client import LedgerClient
from connector.retention import apply_retention, truncate_stream
from metadata import streams
from metadata.model import Retention
from tests.spark.helpers import read, write
from tests.spark.test_stream_source import payloads, stream_query, write_entries


def truncated(uri: str, stream: str, before: int) -> int:
    with LedgerClient(uri) as lc:
        return truncate_stream(lc, stream, before).first_offset


@pytest.mark.parametrize("fail", [True, False])
def test_a_batch_read_of_truncated_offsets(spark, shared_uri, stream, fail):
    write_entries(shared_uri, stream, 12, max_ledger_entries=4)   # offsets 0..11 in 3 ledgers
    assert truncated(shared_uri, stream, 6) == 4
    df = read(spark, shared_uri, stream, startingOffsets=1, failOnDataLoss=str(fail).lower())
    if fail:
        with pytest.raises(Exception, match=r"offsets 1\.\.3 are gone .*the first offset the stream still "
                                                     r"holds is 4; set failOnDataLoss=false to skip them"):
            df.collect()
    else:
        assert sorted(bytes(r.payload) for r in df.collect()) == [
            f"e{i:03d}".encode() for i in range(4, 12)]
    assert read(spark, shared_uri, stream).count() == 8   # earliest is what the stream holds


@pytest.mark.parametrize("fail", [True, False])
def test_a_streaming_query_from_truncated_offsets(spark, shared_uri, stream, fail):
    write_entries(shared_uri, stream, 12, max_ledger_entries=4)
    assert truncated(shared_uri, stream, 9) == 8
    table = f"truncated_{str(fail).lower()}"
    query = stream_query(spark, shared_uri, stream, table, startingOffsets="2",
                         failOnDataLoss=str(fail).lower()).trigger(availableNow=True).start()
    if fail:
        with pytest.raises(Exception, match=r"offsets 2\.\.7 are gone .*the first offset the stream still holds "
                                            r"is 8"):
            query.awaitTermination(120)
    else:
        assert query.awaitTermination(120)
        assert payloads(spark, table) == [f"e{i:03d}".encode() for i in range(8, 12)]


def test_retention_write_options_are_stored_at_commit_and_applied_by_a_retention_run(spark, shared_uri, stream):
    for job in range(3):
        rows = spark.range(job * 1000, (job + 1) * 1000, numPartitions=1)
        write(rows, shared_uri, stream, **({"retentionBytes": 1} if job == 0 else {}))
    with LedgerClient(shared_uri) as lc:
        ledgers = list(streams.iter_ledgers(lc.store, streams.read_stream(lc.store, stream).value))
        sizes = [lc.ledger_metadata(s.ledger_id).length for s in ledgers]
    assert len(ledgers) == 3
    # The last write sets the limit to what its own ledger and the one before hold: the first job's goes.
    write(spark.range(0, 0), shared_uri, stream, retentionBytes=sizes[1] + sizes[2], retentionMs=604800000)
    with LedgerClient(shared_uri) as lc:
        assert streams.read_stream(lc.store, stream).value.retention == Retention(604800.0, sizes[1] + sizes[2])
        result = apply_retention(lc, stream)
    assert (result.first_offset, result.ledgers) == (1000, 1)
    assert sorted(r.id for r in read(spark, shared_uri, stream).collect()) == list(range(1000, 3000))
