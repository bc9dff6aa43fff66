"""Arrow columns built straight from buffers, for the metadata columns and raw rows an executor's read adds.

pyarrow's `pa.array` imports pandas the first time it converts anything (it checks for pandas types), which cost
a cold read worker 1-2 s before its first batch (issue 17's profile); nothing else on the read path needs pandas.
These build the same arrays from NumPy buffers, so a read worker never imports it.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")   # Spark's TimestampType in Arrow (schema.arrow_schema_of)


def int64s(values: np.ndarray) -> pa.Array:
    """An int64 array of values (no nulls)."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def constant(value: int, count: int) -> pa.Array:
    return int64s(np.full(count, value, dtype=np.int64))


def timestamps(micros: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """A timestamp (UTC, microseconds) array; valid marks the non-null rows (None: all of them)."""
    micros = np.ascontiguousarray(micros, dtype=np.int64)
    return pa.Array.from_buffers(TIMESTAMP_TYPE, len(micros), [_validity(valid), pa.py_buffer(micros)])


def times_of(times_ms: Sequence[int | None]) -> pa.Array:
    """Entries' append times (milliseconds, None for an entry without one) as a timestamp column."""
    valid = np.fromiter((t is not None for t in times_ms), dtype=bool, count=len(times_ms))
    micros = np.fromiter((0 if t is None else t * 1000 for t in times_ms), dtype=np.int64, count=len(times_ms))
    return timestamps(micros, None if valid.all() else valid)


def binaries(values: Sequence[bytes]) -> pa.Array:
    """A binary array of values (no nulls): one data buffer and int32 offsets, or int64 (large_binary) past 2 GiB."""
    lengths = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    large = offsets[-1] > np.iinfo(np.int32).max
    kind = pa.large_binary() if large else pa.binary()
    offsets = offsets if large else offsets.astype(np.int32)
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))])


def _validity(valid: np.ndarray | None) -> pa.Buffer | None:
    if valid is None:
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))
