"""The `ledger` PySpark Python Data Source (issue 4)."""
