"""The test session's Spark Python workers, the planning ones and the executors' alike, import PySpark and Py4J from
the bytecode scripts/bootstrap.sh added to pyspark.zip and py4j-*-src.zip (`ledger spark compile`), not by compiling
them at each start."""
from __future__ import annotations

import re

from pyspark.sql.datasource import DataSource, DataSourceReader


def _origins() -> str:
    """Where this worker's PySpark and Py4J came from."""
    import py4j
    import pyspark

    return f"{pyspark.__file__}\n{py4j.__file__}"


class _WhereFrom(DataSource):
    """reader() runs in a planning worker on the driver, read() in an executor's worker."""

    @classmethod
    def name(cls):
        return "pyspark_origin"

    def schema(self):
        return "planner string, executor string"

    def reader(self, schema):
        return _Reader(_origins())


class _Reader(DataSourceReader):
    def __init__(self, planner: str):
        self.planner = planner

    def read(self, partition):
        yield self.planner, _origins()


def test_python_workers_import_pyspark_from_bytecode(spark):
    spark.dataSource.register(_WhereFrom)
    [row] = spark.read.format("pyspark_origin").load().collect()
    for worker, origins in row.asDict().items():
        pyspark_origin, py4j_origin = origins.split("\n")
        assert pyspark_origin.endswith("python/lib/pyspark.zip/pyspark/__init__.pyc"), (
            f"the {worker} worker compiled PySpark from {pyspark_origin}: run `ledger spark compile` "
            f"(scripts/bootstrap.sh does)")
        assert re.search(r"python/lib/py4j-[^/]*-src\.zip/py4j/__init__\.pyc$", py4j_origin), (
            f"the {worker} worker compiled Py4J from {py4j_origin}: run `ledger spark compile` (scripts/bootstrap.sh "
            f"does)")
