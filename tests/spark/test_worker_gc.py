"""In Spark's real Python workers: a task that opens the connector's shared client freezes what the worker
imported (connector/spark/worker_gc.py), so the gc.collect() PySpark's daemon runs after every task walks only
what the worker made since."""
from __future__ import annotations


def test_a_read_tasks_client_freezes_its_workers_long_lived_objects(spark, shared_uri):
    uri = shared_uri

    def probe(_):
        import gc

        from connector.spark import task_client, worker_gc
        from connector.spark.options import LedgerOptions

        with task_client.read_client(LedgerOptions.parse({"metadata": uri, "path": "events"})):
            pass
        return worker_gc.in_daemon_worker(), gc.get_freeze_count() > 0

    assert spark.sparkContext.parallelize(range(2), 2).map(probe).collect() == [(True, True)] * 2
