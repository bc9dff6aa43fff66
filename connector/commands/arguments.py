"""Argument types that several commands share: each refuses a bad value with argparse.ArgumentTypeError and a
message naming the value and what is allowed (a ValueError would make argparse print the function's name)."""
from __future__ import annotations

import argparse
import math

MAX_INTERVAL = 86400.0   # seconds: the longest a loop waits between rounds, a day (time.sleep overflows on 1e300)


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def seconds(text: str) -> float:
    """A finite number of seconds above 0."""
    value = _number(text)
    if not 0 < value < math.inf:  # nan too
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return value


def interval(text: str) -> float:
    """The seconds a loop waits between rounds: above 0 and at most MAX_INTERVAL."""
    value = seconds(text)
    if value > MAX_INTERVAL:
        raise argparse.ArgumentTypeError(f"{text!r} is over {MAX_INTERVAL:,.0f} seconds (a day), the longest "
                                         "interval to wait between rounds")
    return value


def seconds_or_zero(text: str) -> float:
    """A finite number of seconds, 0 or more."""
    value = _number(text)
    if not 0 <= value < math.inf:  # nan too
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan
