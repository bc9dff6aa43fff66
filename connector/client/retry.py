"""Retrying an operation that failed for a reason that time can fix (kazoo's KazooRetry, as an object)."""
from __future__ import annotations

import dataclasses
import random
import time
from typing import Callable, TypeVar

from connector.client.errors import RecoveryIncompleteError

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Retry:
    """Call fn until it stops raising one of retry_on, with exponential backoff and jitter, for at most
    max_tries calls and deadline seconds; then the last error propagates."""

    max_tries: int = 20
    delay: float = 0.2
    backoff: float = 2.0
    max_delay: float = 5.0
    deadline: float = 120.0
    retry_on: tuple[type[BaseException], ...] = (RecoveryIncompleteError,)
    sleep: Callable[[float], None] = time.sleep

    def __call__(self, fn: Callable[..., T], *args, **kwargs) -> T:
        give_up = time.monotonic() + self.deadline
        delay = self.delay
        attempt = 1
        while True:
            try:
                return fn(*args, **kwargs)
            except self.retry_on:
                pause = min(delay, self.max_delay) * random.uniform(0.5, 1.0)
                if attempt >= self.max_tries or time.monotonic() + pause > give_up:
                    raise
                self.sleep(pause)
                delay *= self.backoff
                attempt += 1
