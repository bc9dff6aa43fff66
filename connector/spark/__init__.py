"""The `ledger` PySpark Python Data Source (issue 4).

    from connector.spark import LedgerDataSource
    spark.dataSource.register(LedgerDataSource)

LedgerDataSource is imported on first use, not with the package: the driver keeper
(`python -m connector.spark.driver_keeper`) and other small processes import a module of this package
without paying for the data source's imports (the keeper's start is on a cold write's path).
"""
from __future__ import annotations

__all__ = ["LedgerDataSource"]


def __getattr__(name: str):
    if name == "LedgerDataSource":
        from connector.spark.datasource import LedgerDataSource
        return LedgerDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
