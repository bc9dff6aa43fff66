"""Python's cyclic garbage collector in Spark's pooled Python workers.

PySpark's daemon runs gc.collect() in a reused worker after every task and every planning step
(pyspark/daemon.py). A full collection walks every object the collector tracks, and a worker running the
connector tracks about 100,000 (PySpark, Arrow, gRPC, kazoo, protobuf and the connector's own modules): each
collection took 20-35 ms of CPU, about a seventh of a read task's CPU in a count of 2,000,000 rows, and a
planning step's collection doubled that step's CPU. Nearly all of those objects live as long as the worker, so
they are moved out of the collector's sight (gc.freeze, each time after a collection so that no garbage is kept)
as the worker's first two tasks or steps of the connector start (freeze_long_lived):
- the first freezes what the worker holds then: its imports and PySpark's state;
- the second freezes what came since: the client the first one opened (kazoo, gRPC channels, the event loop), the
  modules it imported and the caches it filled, about 50,000 objects more. Its collection walks those once.
The daemon's collections then walk only what the worker made since (about 480 objects in a count's read
workers, against 53,000 after the first freeze alone). One planning step may start the connector twice (the
reader, then its partitions): there the second freeze comes within the first step.

What is frozen is never collected again, so whatever of it later becomes cyclic garbage stays: at most what the
worker held at those two moments (its modules, PySpark's state, its client, and the task or step starting then),
once per worker. Only in PySpark's daemon workers (the process's __main__ is pyspark.daemon); anywhere else the
connector leaves the collector alone, and so it does everywhere with $LEDGER_WORKER_GC_FREEZE=off (or 0, false,
no).
"""
from __future__ import annotations

import gc
import sys
import threading

from connector.client.switches import switched_off

DAEMON = "pyspark.daemon"
FREEZE_ENV = "LEDGER_WORKER_GC_FREEZE"
FREEZES = 2
_freezes = 0
_lock = threading.Lock()


def freeze_long_lived() -> bool:
    """Called as each task or step of the connector starts. In a PySpark daemon worker, the first two calls each
    collect and then freeze what is tracked; whether this call froze."""
    global _freezes
    if _freezes >= FREEZES or not in_daemon_worker() or switched_off(FREEZE_ENV):
        return False
    with _lock:
        if _freezes >= FREEZES:
            return False
        gc.collect()
        gc.freeze()
        _freezes += 1
    return True


def in_daemon_worker() -> bool:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name == DAEMON
