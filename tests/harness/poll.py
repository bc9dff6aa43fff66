"""Waiting by polling with a deadline, never with bare sleeps."""
from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")

FIRST_INTERVAL = 0.05  # a condition that holds soon is seen soon...
LONGEST_INTERVAL = 0.25  # ...and a long wait does not spend CI's two cores on checks (many run a Spark query)


def poll_until(condition: Callable[[], T], timeout: float = 30.0, interval: float | None = None, what: str = "") -> T:
    """Call condition until it returns something truthy; return that, or fail after timeout. Checks every
    interval seconds if given, else at intervals growing from FIRST_INTERVAL to LONGEST_INTERVAL. A condition
    that finds an id or a count returns it in a tuple: 0 is falsy and would read as "not yet"."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    pause = FIRST_INTERVAL if interval is None else interval
    while True:
        try:
            result = condition()
            if result:
                return result
        except Exception as exc:  # keep polling; report the last error on timeout
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}{detail}")
        time.sleep(pause)
        if interval is None:
            pause = min(LONGEST_INTERVAL, pause * 1.5)
