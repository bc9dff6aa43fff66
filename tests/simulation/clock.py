"""An asyncio event loop on a virtual clock: when nothing is ready, time jumps to the next timer.

There are no sockets in a simulation, so the selector never has anything to report; its select(timeout)
only moves the clock forward by timeout. Everything runs on one thread in an order fixed by the seed.
"""
from __future__ import annotations

import asyncio
import selectors


class SimulationStuck(RuntimeError):
    """Nothing is ready and no timer is set: every task waits for something that cannot happen."""


class _VirtualSelector(selectors.BaseSelector):
    def __init__(self) -> None:
        self.loop: VirtualClockLoop | None = None
        self._keys: dict[int, selectors.SelectorKey] = {}

    def register(self, fileobj, events, data=None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def select(self, timeout=None):
        if timeout is None:
            raise SimulationStuck("no task can make progress and no timer is set")
        if timeout > 0:
            self.loop.now += timeout
        return []

    def get_map(self):
        return dict(self._keys)

    def close(self) -> None:
        self._keys.clear()


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        selector = _VirtualSelector()
        self.now = 0.0
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        return self.now
