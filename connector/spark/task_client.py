"""The LedgerClient an executor's read tasks share: one per Python worker, kept between tasks.

Spark reuses a Python worker for task after task (spark.python.worker.reuse, on by default), and opening a
client costs a ZooKeeper session, a writer registration and new gRPC channels to the nodes: about 25 ms of a
30 ms one-entry partition, paid again by every partition of a batch read and every micro-batch of a streaming
query. Read tasks hold no state in their client (no write handle, no recovery: they open ledgers with
recover=False), so the next read task in the same worker can take the same client.

Write tasks keep a client of their own per task: a write task's client owns its ledger's writer registration,
which must end with the task.

The shared client is replaced, never reused, when:
- the task's client settings differ (another cluster, TLS files or token: a rotated token file reads anew);
- it is older than REUSE_SECONDS (certificates rotated in place are loaded again by then);
- a task using it failed (whatever broke, the next task starts from a fresh session and fresh channels).
A replaced client is closed once no task uses it; the last one is closed when the worker exits.
"""
from __future__ import annotations

import atexit
import contextlib
import threading
import time
from typing import Iterator

from connector.client import LedgerClient
from connector.spark.options import LedgerOptions

REUSE_SECONDS = 600.0


class _Shared:
    def __init__(self, key: tuple, client: LedgerClient):
        self.key = key
        self.client = client
        self.opened = time.monotonic()
        self.users = 0
        self.retired = False


_lock = threading.Lock()
_current: _Shared | None = None


@contextlib.contextmanager
def read_client(options: LedgerOptions) -> Iterator[LedgerClient]:
    """The worker's shared read client for these options (opened if there is none that fits)."""
    shared = _acquire(options)
    try:
        yield shared.client
    except Exception:
        _release(shared, failed=True)
        raise
    except BaseException:  # GeneratorExit when Spark stops reading early: the client is fine
        _release(shared, failed=False)
        raise
    _release(shared, failed=False)


def _acquire(options: LedgerOptions) -> _Shared:
    global _current
    settings = options.task_client_options()
    key = (options.metadata, tuple(sorted(settings.items(), key=lambda item: item[0])))
    with _lock:
        stale = _current
        if stale is not None and (stale.key != key or time.monotonic() - stale.opened > REUSE_SECONDS):
            _retire(stale)
        if _current is None:
            _current = _Shared(key, LedgerClient(options.metadata, **settings))
        _current.users += 1
        return _current


def _release(shared: _Shared, failed: bool) -> None:
    with _lock:
        shared.users -= 1
        if failed:
            _retire(shared)
        else:
            _close_if_idle(shared)


def _retire(shared: _Shared) -> None:
    """Take shared out of use (under _lock): closed now if no task holds it, else when the last one leaves."""
    global _current
    if _current is shared:
        _current = None
    shared.retired = True
    _close_if_idle(shared)


def _close_if_idle(shared: _Shared) -> None:
    if shared.retired and shared.users == 0:
        shared.client.close()  # closing twice is a no-op


@atexit.register
def close_shared() -> None:
    """Close the worker's shared client (at exit; tests call it to start from none)."""
    with _lock:
        if _current is not None:
            _retire(_current)
