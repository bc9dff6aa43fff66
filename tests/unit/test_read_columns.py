"""The read path's Arrow columns (connector/spark/columns.py): the same arrays pa.array builds, without importing
pandas (pyarrow's pa.array imports it on first use: 1-2 s of a cold read worker before its first batch)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from connector.client.entry_time import TimedEntry
from connector.spark import columns as cols
from connector.spark.encoding import encode_entry
from connector.spark.planning import LedgerPartition, ReadBounds
from connector.spark.read import arrow_batches
from tests.spark.helpers import REPO

INT64 = st.integers(-(2**63), 2**63 - 1)
TIME_MS = st.one_of(st.none(), st.integers(0, 2**40))


@settings(deadline=None)
@given(st.lists(INT64, max_size=50))
def test_int64s_are_pa_arrays(values):
    built = cols.int64s(np.array(values, dtype=np.int64))
    built.validate(full=True)
    assert built.equals(pa.array(values, pa.int64()))


@given(st.integers(-(2**40), 2**40), st.integers(0, 20))
def test_constant(value, count):
    assert cols.constant(value, count).equals(pa.array([value] * count, pa.int64()))


@given(st.lists(TIME_MS, max_size=70))
def test_times_of_are_timestamp_arrays_with_their_nulls(times):
    built = cols.times_of(times)
    built.validate(full=True)
    assert built.equals(pa.array([None if t is None else t * 1000 for t in times], cols.TIMESTAMP_TYPE))


@given(st.lists(st.binary(max_size=40), max_size=50))
def test_binaries_are_binary_arrays(values):
    built = cols.binaries(values)
    built.validate(full=True)
    assert built.equals(pa.array(values, pa.binary()))


def test_slices_of_built_arrays_keep_their_values():
    times = cols.times_of([None, 5, None, 7, 9, None, None, None, 11])
    assert times.slice(3, 5).equals(pa.array([7000, 9000, None, None, None], cols.TIMESTAMP_TYPE))
    assert cols.binaries([b"a", b"", b"xyz"]).slice(1).to_pylist() == [b"", b"xyz"]


CHILD = """
import json, sys
from connector.spark.encoding import decode_entry
from connector.spark.planning import LedgerPartition, ReadBounds
from connector.spark.read import arrow_batches, raw_batches
import pyarrow as pa

class Entry:
    def __init__(self, entry_id, payload, time_ms):
        self.entry_id, self.payload, self.time_ms = entry_id, payload, time_ms

payload = open(sys.argv[1], "rb").read()
before = "pandas" in sys.modules
arrow_target = pa.schema([("v", pa.int64()), ("_ledger_id", pa.int64()), ("_entry_id", pa.int64()),
                          ("_offset", pa.int64()), ("_timestamp", pa.timestamp("us", tz="UTC"))])
rows = list(arrow_batches([Entry(0, payload, 1700000000000)], LedgerPartition(3, 0, 0, 10), arrow_target,
                          ReadBounds(), with_metadata=True))
raw_target = pa.schema([("ledger_id", pa.int64()), ("entry_id", pa.int64()), ("payload", pa.binary()),
                        ("_offset", pa.int64()), ("_timestamp", pa.timestamp("us", tz="UTC"))])
raw = list(raw_batches([Entry(0, b"x", None), Entry(1, b"yz", 5)], LedgerPartition(3, 0, 1, 10), raw_target))
after = "pandas" in sys.modules   # before the checks below: converting timestamps to Python imports it
print(json.dumps({"before": before, "after": after, "rows": rows[0].num_rows,
                  "raw": [b.column("entry_id").to_pylist() for b in raw]}))
"""


def test_reading_entries_with_metadata_columns_does_not_import_pandas(tmp_path):
    from connector.spark.encoding import encode_entry

    entry = tmp_path / "entry"
    entry.write_bytes(encode_entry(0, [pa.record_batch({"v": pa.array([1, 2, 3], pa.int64())})]))
    run = subprocess.run([sys.executable, "-c", CHILD, str(entry)], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen == {"before": False, "after": False, "rows": 3, "raw": [[0, 1]]}, seen


def test_a_data_column_named_like_a_metadata_column_keeps_its_values_without_include_metadata():
    """Spark read audit 2026-11-29: a stream written from a read with includeMetadata has columns _offset, ...
    of its own; a read of it (without includeMetadata, as the refusal of includeMetadata on it advises) replaced
    their values with its own offsets, ledgers and times."""
    data = pa.RecordBatch.from_pydict({"x": pa.array([1, 2], pa.int64()), "_offset": pa.array([500, 501], pa.int64()),
                                       "_ledger_id": pa.array([3, 3], pa.int64())})
    entry = TimedEntry(0, encode_entry(0, [data]), 1_700_000_000_000)
    target = data.schema
    out = list(arrow_batches([entry], LedgerPartition(7, 0, 0, first_offset=10), target, ReadBounds(),
                             with_metadata=False))
    assert out[0].column("_offset").to_pylist() == [500, 501] and out[0].column("_ledger_id").to_pylist() == [3, 3]
