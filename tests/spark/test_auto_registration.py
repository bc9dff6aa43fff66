"""Issue 16 item 4: format("ledger") works in a SparkSession that never calls spark.dataSource.register:
Spark's lookup finds the top-level module pyspark_ledger and its DefaultSource."""
import json

import pyspark_ledger
from connector.spark import LedgerDataSource
from tests.spark.helpers import run_application


def test_the_lookup_module_exports_the_data_source():
    assert pyspark_ledger.DefaultSource is LedgerDataSource and LedgerDataSource.name() == "ledger"


def test_a_session_that_never_registers_reads_and_writes_ledger(shared_uri, stream, tmp_path):
    out = run_application("tests.spark.unregistered_session", shared_uri, stream, log=tmp_path / "app.log",
                          timeout=240)
    assert json.loads(out.strip().splitlines()[-1]) == {"count": 100, "sum_id": sum(range(100))}
