"""The client's event loop on a daemon thread; the public API is synchronous on top of it."""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Awaitable, TypeVar

T = TypeVar("T")


class Runtime:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="ledger-client", daemon=True)
        self._thread.start()

    def submit(self, coro: Awaitable[T]) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Awaitable[T]) -> T:
        return self.submit(coro).result()

    def stop(self) -> None:
        self.run(self._cancel_tasks())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    @staticmethod
    async def _cancel_tasks() -> None:
        """Let what is left (calls being cancelled, LAC writes) finish, so nothing dies pending with the loop."""
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
