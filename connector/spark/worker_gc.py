"""Python's cyclic garbage collector in Spark's pooled Python workers.

PySpark's daemon runs gc.collect() in a reused worker after every task and every planning step
(pyspark/daemon.py). A full collection walks every object the collector tracks, and a worker running the
connector tracks about 100,000 (PySpark, Arrow, gRPC, kazoo, protobuf and the connector's own modules): each
collection took 20-35 ms of CPU, about a seventh of a read task's CPU in a count of 2,000,000 rows, and a
planning step's collection doubled that step's CPU. The objects alive when the connector first runs in a
worker (modules, classes, PySpark's state) live as long as the worker, so once per worker they are moved out
of the collector's sight (gc.freeze, after a collection so that no garbage is kept): the daemon's collections
then walk only what the worker made since.

Only in PySpark's daemon workers (the process's __main__ is pyspark.daemon): anywhere else the connector leaves
the collector alone.
"""
from __future__ import annotations

import gc
import sys
import threading

DAEMON = "pyspark.daemon"
_frozen = False
_lock = threading.Lock()


def freeze_long_lived() -> bool:
    """In a PySpark daemon worker, the first call collects and then freezes what is tracked; whether it did."""
    global _frozen
    if _frozen or not in_daemon_worker():
        return False
    with _lock:
        if _frozen:
            return False
        gc.collect()
        gc.freeze()
        _frozen = True
    return True


def in_daemon_worker() -> bool:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name == DAEMON
