"""In Spark's real Python workers: the connector's first two tasks or steps in a worker freeze what the worker holds
(connector/spark/worker_gc.py), so the gc.collect() PySpark's daemon runs after every task walks only what the
worker made since.

Workers are reused for the whole test session, and earlier tests' tasks have frozen theirs already: each task here
first undoes that (gc.unfreeze, and the module's count), then uses a client that no earlier task opened (settings
of its own: a token file), as read tasks in a fresh worker would: the first opens it, the second reuses it. What
the first task of a fresh worker leaves besides its client (the modules it imported: pyarrow's IPC, lz4, the
client's protobuf and gRPC code, about 50,000 objects in a count) this worker imported long ago, so the probe
leaves objects of its own in their place.
"""
from __future__ import annotations


def test_a_workers_first_two_tasks_freeze_what_the_worker_holds_and_the_client_it_opened(spark, shared_uri,
                                                                                         tmp_path):
    uri = shared_uri
    token = tmp_path / "token"
    token.write_text("worker-gc-test\n")

    def probe(_):
        import gc

        from connector.spark import task_client, worker_gc
        from connector.spark.options import LedgerOptions

        gc.unfreeze()
        worker_gc._freezes = 0
        options = LedgerOptions.parse({"metadata": uri, "path": "events", "authTokenFile": str(token)})
        with task_client.read_client(options) as client:     # the first task opens the client
            client.list_ledgers()
            worker_gc.left_by_the_first_task = [[n] for n in range(5000)]
        after_first = gc.get_freeze_count() > 0
        gc.collect()                                          # as PySpark's daemon does after each task
        with task_client.read_client(options):                # the second task reuses it
            tracked = len(gc.get_objects())
        return worker_gc.in_daemon_worker(), after_first, tracked

    for in_daemon, after_first, tracked in spark.sparkContext.parallelize(range(2), 2).map(probe).collect():
        assert in_daemon and after_first
        # What a collection walks from then on: not the client (kazoo, gRPC, its event loop) nor what the first
        # task imported, tens of thousands of objects, only what came after the second freeze.
        assert tracked < 2000, tracked
