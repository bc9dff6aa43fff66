"""In Spark's real Python workers: opening the connector's shared client freezes what the worker holds
(connector/spark/worker_gc.py), so the gc.collect() PySpark's daemon runs after every task walks only what the
worker made since.

Workers are reused for the whole test session, and earlier tests' tasks have frozen theirs already: each task here
first undoes that (gc.unfreeze, and the module's flag), then opens a client that no earlier task opened (settings
of its own: a token file), as a read task's first client in a fresh worker would.
"""
from __future__ import annotations


def test_a_workers_first_client_freezes_what_the_worker_holds(spark, shared_uri, tmp_path):
    uri = shared_uri
    token = tmp_path / "token"
    token.write_text("worker-gc-test\n")

    def probe(_):
        import gc

        from connector.spark import task_client, worker_gc
        from connector.spark.options import LedgerOptions

        gc.unfreeze()
        worker_gc._frozen = False
        options = LedgerOptions.parse({"metadata": uri, "path": "events", "authTokenFile": str(token)})
        with task_client.read_client(options):
            pass
        return worker_gc.in_daemon_worker(), gc.get_freeze_count() > 0

    assert spark.sparkContext.parallelize(range(2), 2).map(probe).collect() == [(True, True)] * 2
