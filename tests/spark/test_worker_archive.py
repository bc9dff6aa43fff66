"""The test session's Spark Python workers, the planning ones and the executors' alike, import PySpark from the
bytecode scripts/bootstrap.sh added to its pyspark.zip (`ledger spark compile`), not by compiling it at each start."""
from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader


def _pyspark_file() -> str:
    import pyspark

    return pyspark.__file__


class _WhereFrom(DataSource):
    """reader() runs in a planning worker on the driver, read() in an executor's worker."""

    @classmethod
    def name(cls):
        return "pyspark_origin"

    def schema(self):
        return "planner string, executor string"

    def reader(self, schema):
        return _Reader(_pyspark_file())


class _Reader(DataSourceReader):
    def __init__(self, planner: str):
        self.planner = planner

    def read(self, partition):
        yield self.planner, _pyspark_file()


def test_python_workers_import_pyspark_from_bytecode(spark):
    spark.dataSource.register(_WhereFrom)
    [row] = spark.read.format("pyspark_origin").load().collect()
    for worker, origin in row.asDict().items():
        assert origin.endswith("python/lib/pyspark.zip/pyspark/__init__.pyc"), (
            f"the {worker} worker compiled PySpark from {origin}: run `ledger spark compile` (scripts/bootstrap.sh "
            f"does)")
