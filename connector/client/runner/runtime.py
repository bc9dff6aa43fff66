"""The client event loop, on a daemon thread; the public API is synchronous on top of it.

One loop per process, shared by every LedgerClient: grpc.aio binds its completion-queue poller to the
first event loop it serves, so a loop per client left grpc calling into closed loops once a client was
closed ("RuntimeError: Event loop is closed" tracebacks in Spark's reused Python workers, services and
scripts that open many clients). A client cleans up what it started (its pipelines, recoveries and
connections) when it closes; the loop lives as long as the process. A forked child starts its own.

Starting the loop also keeps the process's large buffers on the heap (protos/heap.py): the messages a writer
joins and gRPC copies, and the ReadRange messages a reader receives, otherwise land on fresh pages.
$LEDGER_CLIENT_HEAP_TUNING=off (or 0, false, no) leaves glibc's settings to the host application.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from typing import Awaitable, TypeVar

from connector.client.switches import switched_off
from protos.heap import keep_large_buffers_on_heap

T = TypeVar("T")

_lock = threading.Lock()
_shared: "Runtime | None" = None
HEAP_TUNING_ENV = "LEDGER_CLIENT_HEAP_TUNING"


class Runtime:
    def __init__(self) -> None:
        self.pid = os.getpid()
        if not switched_off(HEAP_TUNING_ENV):
            keep_large_buffers_on_heap()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="ledger-client", daemon=True)
        self._thread.start()

    @classmethod
    def shared(cls) -> "Runtime":
        """The process's client loop, started on first use."""
        global _shared
        with _lock:
            if _shared is None or _shared.pid != os.getpid():
                _shared = cls()
            return _shared

    def submit(self, coro: Awaitable[T]) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Awaitable[T]) -> T:
        return self.submit(coro).result()
