"""The LedgerClient an executor's read tasks share: one per Python worker, kept between tasks. A streaming sink's
driver-side steps (prepare, commit, abort) share one the same way (driver_client): Spark runs them, batch after
batch, in pooled Python workers, and a client of their own cost each batch two ZooKeeper sessions and writer
registrations (about half of a commit's time).

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
A replaced client is closed once no task uses it. The last one ends with the worker: Spark's forked workers
exit with os._exit (or are killed when idle), so its ZooKeeper session, and the writer registration in it,
expire after the session timeout.
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
        self.closed = False


# Guards _current and the users/retired/closed fields. Re-entrant: a read generator that the garbage collector
# finalises releases its client, and that may happen at any allocation, inside these steps too. No client is
# opened or closed by a step while it holds the lock.
_lock = threading.RLock()
_current: _Shared | None = None


def read_client(options: LedgerOptions) -> contextlib.AbstractContextManager[LedgerClient]:
    """The worker's shared read client for these options (opened if there is none that fits)."""
    return _shared_client(options.metadata, options.task_client_options())


def driver_client(options: LedgerOptions) -> contextlib.AbstractContextManager[LedgerClient]:
    """The shared client of a streaming sink's driver-side steps: the driver's settings (a short ZooKeeper connect
    timeout: a wrong URI fails the query at once). Replaced on failure, as a read task's is."""
    return _shared_client(options.metadata, options.client_options())


@contextlib.contextmanager
def _shared_client(metadata: str, settings: dict) -> Iterator[LedgerClient]:
    shared = _acquire(metadata, settings)
    try:
        yield shared.client
    except Exception:
        _release(shared, failed=True)
        raise
    except BaseException:  # GeneratorExit when Spark stops reading early: the client is fine
        _release(shared, failed=False)
        raise
    _release(shared, failed=False)


def _acquire(metadata: str, settings: dict) -> _Shared:
    global _current
    key = (metadata, tuple(sorted(settings.items(), key=lambda item: item[0])))
    with _lock:
        idle = _retire_unfit(key)
        shared = _current
        if shared is not None:
            shared.users += 1
    _close(idle)
    if shared is not None:
        return shared
    opened = _Shared(key, LedgerClient(metadata, **settings))
    opened.users = 1
    with _lock:
        idle = _retire_unfit(key)
        if _current is None:
            _current = opened
        else:
            opened.retired = True   # another was installed meanwhile: this one is closed when this task is done
    _close(idle)
    return opened


def _release(shared: _Shared, failed: bool) -> None:
    with _lock:
        shared.users -= 1
        if failed:
            _retire(shared)
        idle = [shared] if _idle(shared) else []
    _close(idle)


def _retire_unfit(key: tuple) -> list[_Shared]:
    """Under _lock: retire the current client if it does not fit key or is too old; the retired clients no task
    holds, to be closed once the lock is released."""
    stale = _current
    if stale is None or (stale.key == key and time.monotonic() - stale.opened <= REUSE_SECONDS):
        return []
    _retire(stale)
    return [stale] if _idle(stale) else []


def _retire(shared: _Shared) -> None:
    """Under _lock: take shared out of use; it is closed when no task holds it."""
    global _current
    if _current is shared:
        _current = None
    shared.retired = True


def _idle(shared: _Shared) -> bool:
    """Under _lock: retired and held by no task, so due to be closed (once: closed clients are never idle)."""
    if shared.retired and shared.users == 0 and not shared.closed:
        shared.closed = True
        return True
    return False


def _close(clients: list[_Shared]) -> None:
    for shared in clients:
        shared.client.close()


@atexit.register
def close_shared() -> None:
    """Close the worker's shared client, if no task holds it (tests call it to start from none; at a normal
    interpreter exit too, though Spark's forked workers end with os._exit or SIGKILL, and their client's
    session then expires on its own)."""
    with _lock:
        shared = _current
        if shared is not None:
            _retire(shared)
        idle = [shared] if shared is not None and _idle(shared) else []
    _close(idle)
