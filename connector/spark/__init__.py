"""The `ledger` PySpark Python Data Source (issue 4).

    from connector.spark import LedgerDataSource
    spark.dataSource.register(LedgerDataSource)
"""
from connector.spark.datasource import LedgerDataSource

__all__ = ["LedgerDataSource"]
