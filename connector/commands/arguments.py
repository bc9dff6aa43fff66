"""Argument types that several commands share: each refuses a bad value with argparse.ArgumentTypeError and a
message naming the value and what is allowed (a ValueError would make argparse print the function's name)."""
from __future__ import annotations

import argparse
import fractions
import math
import os
import pathlib
import re

from connector.client import default_metadata_uri

MAX_INTERVAL = 86400.0   # seconds: the longest a loop waits between rounds, a day (time.sleep overflows on 1e300)
SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def positive(text: str) -> int:
    value = _integer(text)
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def non_negative(text: str) -> int:
    value = _integer(text)
    if value is None or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 0")
    return value


def ledger_id(text: str) -> int:
    """A ledger id as written: ASCII digits (int() would also take ' 1', '1_0' or Arabic-Indic digits)."""
    value = _integer(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a ledger id (an integer, such as `ledger list` prints)")
    return value


def positive_number(text: str) -> float:
    """A finite number above 0 (a rate, say)."""
    value = _number(text)
    if not 0 < value < math.inf:  # nan too
        raise argparse.ArgumentTypeError(f"{text!r} is not a number > 0")
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


def size(text: str) -> int:
    """A number of bytes, 1 or more, with an optional unit K, M, G, T or P (powers of 1024) and an optional B or iB:
    4096, 100G, 64MiB, 1.5T. Exact: a huge one is a huge integer, never a float's infinity."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgtp]?)(?:i?b)?\s*", text.lower())
    value = int(fractions.Fraction(match.group(1)) * SIZE_UNITS[match.group(2)]) if match else 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: give bytes with an optional unit K, M, G, T or P (powers of 1024: 100G, 64MiB)")
    return value


def entry_bytes(text: str) -> int:
    """The size of an arrow entry a writer cuts, within what the Spark option entryBytes takes."""
    from connector.spark.options import MAX_ENTRY_BYTES, MIN_ENTRY_BYTES   # here: `ledger list` loads no Spark

    value = positive(text)
    if not MIN_ENTRY_BYTES <= value <= MAX_ENTRY_BYTES:
        raise argparse.ArgumentTypeError(f"{text} is not within {MIN_ENTRY_BYTES:,}..{MAX_ENTRY_BYTES:,}, the sizes "
                                         "an arrow entry may have (as the Spark option entryBytes)")
    return value


def non_empty(text: str) -> str:
    """A value that says something: an empty one would silently stand for a default (the current directory, the
    environment's metadata URI or TLS file)."""
    if not text:
        raise argparse.ArgumentTypeError("'' is empty: give a value, or leave the option out for its default")
    return text


def directory(text: str) -> pathlib.Path:
    """A directory to work in: an existing one, or one to create (not a file)."""
    value = pathlib.Path(non_empty(text))
    if value.exists() and not value.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a directory: give a new or existing directory")
    return value


PASSWORD_ENV = "LEDGER_PASSWORD"   # a ledger password's default: given so, `ps` does not show it as it shows argv


def default_password() -> str:
    """--password's default: $LEDGER_PASSWORD, else empty (argparse passes it through `password` as it would a
    given value)."""
    return os.environ.get(PASSWORD_ENV, "")


def default_passwords(given: list[bytes] | None) -> list[bytes]:
    """A repeatable --password's values: those given, else the default one."""
    return given or [password(default_password())]


def password(text: str) -> bytes:
    """A ledger password as the bytes the shell passed: any bytes, valid UTF-8 or not (os.fsencode undoes how
    Python decoded the argument), so that `--password $'\\xff'` opens a ledger created with that password."""
    return os.fsencode(text)


def add_metadata(parser: argparse.ArgumentParser) -> None:
    """The --metadata option of every command that reads or writes the metadata."""
    parser.add_argument("--metadata", type=non_empty, default=default_metadata_uri(),
                        help="metadata URI, zk://[user:secret@]host:port/root "
                             "(default: $LEDGER_METADATA or zk://127.0.0.1:2181/ledgers)")


def _integer(text: str) -> int | None:
    """text as an integer if it is one in ASCII digits (with an optional sign), else None (also past the 4,300
    digits int() converts)."""
    try:
        return int(text) if re.fullmatch(r"[+-]?[0-9]+", text) else None
    except ValueError:
        return None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan
