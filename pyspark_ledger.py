"""Spark finds the `ledger` data source on its own through this module.

Spark's Python data source lookup imports every top-level module whose name starts with `pyspark_` and
registers its DefaultSource, so `format("ledger")` works in any SparkSession whose Python has this
package installed, without `spark.dataSource.register(LedgerDataSource)` (which keeps working).
"""
from connector.spark.datasource import LedgerDataSource as DefaultSource

__all__ = ["DefaultSource"]
