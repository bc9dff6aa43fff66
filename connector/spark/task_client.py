"""The LedgerClients Spark's pooled Python workers share, kept from one step to the next: one for an executor's
read tasks (read_client), and one, with the driver's settings, for the driver-side steps (driver_client): finding a
stream's schema, planning a batch read, preparing, committing and aborting a batch write or a streaming sink's
micro-batch.

Spark reuses a Python worker for task after task, and for step after step of the same kind (each kind has a worker
of its own; spark.python.worker.reuse, on by default). Opening a client costs a ZooKeeper session, a writer
registration and new gRPC channels to the nodes: about 25 ms of a 30 ms one-entry partition, paid again by every
partition of a batch read and every micro-batch of a streaming query. Clients of their own cost a sink's
micro-batch two ZooKeeper sessions and writer registrations (about half of a commit's time), a batch read three
sessions before its first task (about 30 ms) and a batch write two. Read tasks and driver-side steps leave no
state in their client for the next one: no write handle (none of them appends; read tasks open ledgers with
recover=False), and what the driver-side steps recover (dangling ledgers before a read, ledgers a write
discards) is recovered and closed within the step. What stays is what a client keeps anyway: its ZooKeeper
session, the nodes' addresses and channels.

Write tasks keep a client of their own per task (write_task_client): a write task's client owns its ledger's
writer registration, which must end with the task. Each of the three is where a task or step starts: the
worker's first two also freeze what the worker holds (worker_gc.py).

A shared client is replaced, never reused, when:
- the step's client settings differ (another cluster, TLS files or token: a rotated token file reads anew; the
  bound on waiting for ZooKeeper, $LEDGER_ZK_WAIT_SECONDS);
- it is older than REUSE_SECONDS (certificates rotated in place are loaded again by then);
- a step using it failed (whatever broke, the next step starts from a fresh session and fresh channels).
A replaced client is closed once no step uses it. The last one ends with the worker: Spark's forked workers
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
from connector.spark.worker_gc import freeze_long_lived
from metadata.store import zk_wait_seconds

REUSE_SECONDS = 600.0


def read_client(options: LedgerOptions) -> contextlib.AbstractContextManager[LedgerClient]:
    """The worker's shared read client for these options (opened if there is none that fits)."""
    freeze_long_lived()
    return _READ_TASKS.use(options.metadata, options.task_client_options())


def driver_client(options: LedgerOptions) -> contextlib.AbstractContextManager[LedgerClient]:
    """The shared client of the driver-side steps: the driver's settings (a short ZooKeeper connect timeout: a
    wrong URI fails the query at once). Replaced on failure, as a read task's is."""
    freeze_long_lived()
    return _DRIVER_STEPS.use(options.metadata, options.client_options())


def write_task_client(options: LedgerOptions) -> LedgerClient:
    """A write task's client of its own (never shared: it owns the task's ledger, and its registration ends
    with the task)."""
    freeze_long_lived()
    return LedgerClient(options.metadata, **options.task_client_options())


class _Shared:
    def __init__(self, key: tuple, client: LedgerClient):
        self.key = key
        self.client = client
        self.opened = time.monotonic()
        self.users = 0
        self.retired = False
        self.closed = False


class _Sharing:
    """The one client that a kind of step (read tasks, driver-side steps) shares in this process."""

    def __init__(self) -> None:
        # Guards _current and the users/retired/closed fields. Re-entrant: a read generator that the garbage
        # collector finalises releases its client, and that may happen at any allocation, inside these steps
        # too. No client is opened or closed by a step while it holds the lock.
        self._lock = threading.RLock()
        self._current: _Shared | None = None

    @contextlib.contextmanager
    def use(self, metadata: str, settings: dict) -> Iterator[LedgerClient]:
        shared = self._acquire(metadata, settings)
        try:
            yield shared.client
        except Exception:
            self._release(shared, failed=True)
            raise
        except BaseException:  # GeneratorExit when Spark stops reading early: the client is fine
            self._release(shared, failed=False)
            raise
        self._release(shared, failed=False)

    def close(self) -> None:
        """Close the shared client, if no step holds it (else once the last one lets it go)."""
        with self._lock:
            shared = self._current
            if shared is not None:
                self._retire(shared)
            idle = [shared] if shared is not None and self._idle(shared) else []
        _close(idle)

    def _acquire(self, metadata: str, settings: dict) -> _Shared:
        # With the bound its metadata calls wait for ZooKeeper ($LEDGER_ZK_WAIT_SECONDS), read when a client opens.
        key = (metadata, tuple(sorted(settings.items(), key=lambda item: item[0])), zk_wait_seconds())
        with self._lock:
            idle = self._retire_unfit(key)
            shared = self._current
            if shared is not None:
                shared.users += 1
        _close(idle)
        if shared is not None:
            return shared
        opened = _Shared(key, LedgerClient(metadata, **settings))
        opened.users = 1
        with self._lock:
            idle = self._retire_unfit(key)
            if self._current is None:
                self._current = opened
            else:
                opened.retired = True   # another was installed meanwhile: this one is closed when this step is done
        _close(idle)
        return opened

    def _release(self, shared: _Shared, failed: bool) -> None:
        with self._lock:
            shared.users -= 1
            if failed:
                self._retire(shared)
            idle = [shared] if self._idle(shared) else []
        _close(idle)

    def _retire_unfit(self, key: tuple) -> list[_Shared]:
        """Under _lock: retire the current client if it does not fit key or is too old; the retired clients no
        step holds, to be closed once the lock is released."""
        stale = self._current
        if stale is None or (stale.key == key and time.monotonic() - stale.opened <= REUSE_SECONDS):
            return []
        self._retire(stale)
        return [stale] if self._idle(stale) else []

    def _retire(self, shared: _Shared) -> None:
        """Under _lock: take shared out of use; it is closed when no step holds it."""
        if self._current is shared:
            self._current = None
        shared.retired = True

    @staticmethod
    def _idle(shared: _Shared) -> bool:
        """Under _lock: retired and held by no step, so due to be closed (once: closed clients are never idle)."""
        if shared.retired and shared.users == 0 and not shared.closed:
            shared.closed = True
            return True
        return False


def _close(clients: list[_Shared]) -> None:
    for shared in clients:
        shared.client.close()


_READ_TASKS = _Sharing()
_DRIVER_STEPS = _Sharing()


@atexit.register
def close_shared() -> None:
    """Close the worker's shared clients, if no step holds them (tests call it to start from none; at a normal
    interpreter exit too, though Spark's forked workers end with os._exit or SIGKILL, and their client's session
    then expires on its own)."""
    try:
        _READ_TASKS.close()
    finally:
        _DRIVER_STEPS.close()
