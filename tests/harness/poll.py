"""Waiting by polling with a deadline, never with bare sleeps."""
from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def poll_until(condition: Callable[[], T], timeout: float = 30.0, interval: float = 0.05, what: str = "") -> T:
    """Call condition until it returns something truthy; return that, or fail after timeout."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
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
        time.sleep(interval)
