"""connector/spark/row_index.py and its use in planning and read.seek_entry: a read that starts at row k of an
arrow ledger is planned from the entry holding k, without reading the entries below it (issue 14 item 5)."""
import itertools

import pyarrow as pa
import pytest
from hypothesis import given, strategies as st

from connector.client.ops.close import close_own
from connector.spark.encoding import encode_entry
from connector.spark.planning import LedgerPartition, LedgerSpan, ReadBounds, plan_partitions
from connector.spark.read import seek_entry
from connector.spark.row_index import MAX_POINTS, ROW_INDEX_KEY, RowIndex, RowIndexBuilder
from connector.spark.spans import batch_spans
from metadata.model import Fragment, LedgerMetadata, LedgerState, StreamLedger, StreamRecord, Versioned


def built(row_counts) -> RowIndex:
    builder = RowIndexBuilder()
    for first_row in itertools.accumulate([0] + list(row_counts[:-1])):
        builder.add(first_row)
    return builder.index()


def entry_of_row(row_counts, row) -> int:
    """The entry holding row, counted the slow way."""
    ends = list(itertools.accumulate(row_counts))
    return next(e for e, end in enumerate(ends) if end > row)


@given(row_counts=st.lists(st.integers(1, 50), min_size=1, max_size=2000), data=st.data())
def test_index_starts_at_most_a_stride_before_the_row_and_skips_nothing_it_holds(row_counts, data):
    index = RowIndex.decode(built(row_counts).encode())
    assert index.entries == len(row_counts) and len(index.first_rows) <= MAX_POINTS
    row = data.draw(st.integers(0, sum(row_counts) - 1))
    exact = entry_of_row(row_counts, row)
    first, last = index.first_entry(row), index.last_entry(row)
    assert exact - index.stride < first <= exact   # nothing at or above row is skipped, at most stride-1 below read
    assert exact <= last < exact + index.stride    # nothing up to row is cut off


def test_a_ledger_of_few_entries_is_indexed_entry_by_entry():
    index = built([10] * MAX_POINTS)
    assert index.stride == 1
    assert [index.first_entry(r) for r in (0, 9, 10, 2555)] == [0, 0, 1, 255]
    assert [index.last_entry(r) for r in (0, 9, 10, 2559)] == [0, 0, 1, 255]


def test_the_index_of_a_100000_entry_ledger_stays_small():
    text = built([1000] * 100_000).encode()
    assert len(text) < 1024, len(text)


def closed(last_entry_id, index=None, state=LedgerState.CLOSED):
    custom = ((ROW_INDEX_KEY, index),) if index is not None else ()
    return LedgerMetadata(1, 3, 3, 2, (Fragment(0, ("a", "b", "c")),), state=state, last_entry_id=last_entry_id,
                          custom_metadata=custom)


def test_an_index_is_used_only_if_it_covers_exactly_the_closed_ledgers_entries():
    text = built([5, 5, 5]).encode()
    assert RowIndex.of(closed(2, text)) == RowIndex(3, 1, (0, 5, 10))
    assert RowIndex.of(closed(3, text)) is None              # another entry count: not this ledger's index
    assert RowIndex.of(closed(2)) is None                    # written before the index existed
    assert RowIndex.of(closed(2, text, LedgerState.OPEN)) is None
    assert RowIndex.of(closed(2, "2:3:1:AAUF")) is None       # a version this software does not read
    assert RowIndex.of(closed(2, "1:3:1:!!")) is None


def test_close_stores_custom_metadata_in_the_closing_update_once():
    meta = LedgerMetadata(7, 3, 3, 2, (Fragment(0, ("a", "b", "c")),), custom_metadata=(("stream", "s"),))
    stored = close_own(7, 41, 100, {ROW_INDEX_KEY: "1:42:1:AA"})(meta)
    assert stored.custom == {"stream": "s", ROW_INDEX_KEY: "1:42:1:AA"} and stored.last_entry_id == 41
    assert close_own(7, 41, 100, {ROW_INDEX_KEY: "other"})(stored) is None   # closing twice changes nothing


INDEXED = LedgerSpan(5, 99, 1000, 1000 + 100 * 10 - 1, row_index=built([10] * 100))   # 100 entries of 10 rows


def ids(partitions):
    return [(p.ledger_id, p.first_entry, p.last_entry, p.seek_row) for p in partitions]


def test_planning_starts_at_the_entry_holding_the_first_offset_and_ends_at_the_last():
    assert ids(plan_partitions([INDEXED], ReadBounds.from_offsets(1555, None), 0, False)) == [(5, 55, 99, None)]
    assert ids(plan_partitions([INDEXED], ReadBounds.from_offsets(1555, 1575), 0, False)) == [(5, 55, 57, None)]
    assert ids(plan_partitions([INDEXED], ReadBounds.from_offsets(1999, None), 0, False)) == [(5, 99, 99, None)]
    assert ids(plan_partitions([INDEXED], ReadBounds.from_offsets(1555, None), 20, False)) == [
        (5, 55, 74, None), (5, 75, 94, None), (5, 95, 99, None)]


def test_a_ledger_without_an_index_is_planned_whole_with_the_row_to_seek():
    span = LedgerSpan(5, 99, 1000, 1999)
    assert ids(plan_partitions([span], ReadBounds.from_offsets(1555, None), 0, False)) == [(5, 0, 99, 555)]
    assert ids(plan_partitions([span], ReadBounds.from_offsets(1000, None), 0, False)) == [(5, 0, 99, None)]


class StoreOf:
    def __init__(self, meta):
        self.meta = meta

    def read_ledger(self, ledger_id):
        return Versioned(self.meta, 0)


def test_a_micro_batch_is_planned_from_the_index_in_the_sealed_ledgers_metadata():
    record = StreamRecord("events", format="arrow", tail=(StreamLedger(5, 1000, 1999),))
    spans, _ = batch_spans(StoreOf(closed(99, built([10] * 100).encode())), record, 1990, 1999)
    planned = plan_partitions(spans, ReadBounds.from_offsets(1990, 2000), 0, offset_per_entry=False)
    assert planned == [LedgerPartition(5, 99, 99, 1000)]


class EntriesOf:
    """A read handle over arrow entries of the given row counts that counts the entries it reads."""

    def __init__(self, row_counts):
        firsts = itertools.accumulate([0] + row_counts[:-1])
        self.payloads = [encode_entry(f, [_rows(n)]) for f, n in zip(firsts, row_counts)]
        self.reads = 0

    def read(self, first, last, confirmed=-1, views=False):
        self.reads += last - first + 1
        return iter([_Entry(e, self.payloads[e]) for e in range(first, last + 1)])


class _Entry:
    def __init__(self, entry_id, payload):
        self.entry_id, self.payload = entry_id, payload


def _rows(n):
    return pa.record_batch([pa.array(range(n), pa.int64())], names=["id"])


@pytest.mark.parametrize("row,expected", [(0, 0), (6, 2), (8, 2), (9, 3), (2999, 999), (3000, 1000)])
def test_seek_entry_finds_the_first_entry_holding_the_row_in_a_few_reads(row, expected):
    handle = EntriesOf([3] * 1000)
    assert seek_entry(handle, LedgerPartition(1, 0, 999, 0, seek_row=row)) == expected
    assert handle.reads <= 11


def test_seek_entry_reads_nothing_for_a_short_range_or_nothing_to_seek():
    handle = EntriesOf([3] * 1000)
    assert seek_entry(handle, LedgerPartition(1, 0, 9, 0, seek_row=20)) == 0
    assert seek_entry(handle, LedgerPartition(1, 0, 999, 0)) == 0
    assert handle.reads == 0
