"""Python's cyclic garbage collector in Spark's pooled Python workers.

PySpark's daemon runs gc.collect() in a reused worker after every task and every planning step
(pyspark/daemon.py). A full collection walks every object the collector tracks, and a worker running the
connector tracks about 100,000 (PySpark, Arrow, gRPC, kazoo, protobuf and the connector's own modules): each
collection took 20-35 ms of CPU, about a seventh of a read task's CPU in a count of 2,000,000 rows, and a
planning step's collection doubled that step's CPU. Nearly all of those objects live as long as the worker, so
the first time the connector opens a client in a worker, everything the worker holds then is moved out of the
collector's sight (gc.freeze, after a collection so that no garbage is kept): the daemon's collections then walk
only what the worker made since.

What is frozen is never collected again, so whatever of it later becomes cyclic garbage stays: at most what the
worker held at that moment (its modules and PySpark's state, and the task or step it was running), once per
worker. Only in PySpark's daemon workers (the process's __main__ is pyspark.daemon); anywhere else the connector
leaves the collector alone, and so it does everywhere with $LEDGER_WORKER_GC_FREEZE=off (or 0, false, no).
"""
from __future__ import annotations

import gc
import sys
import threading

from connector.client.switches import switched_off

DAEMON = "pyspark.daemon"
FREEZE_ENV = "LEDGER_WORKER_GC_FREEZE"
_frozen = False
_lock = threading.Lock()


def freeze_long_lived() -> bool:
    """In a PySpark daemon worker, the first call collects and then freezes what is tracked; whether it did."""
    global _frozen
    if _frozen or not in_daemon_worker() or switched_off(FREEZE_ENV):
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
