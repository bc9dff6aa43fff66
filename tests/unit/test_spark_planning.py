"""connector/spark/planning.py: partitions per ledger or entry range, pruned by offsets and filters."""
import collections

from hypothesis import given, strategies as st
from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, LessThanOrEqual, StringStartsWith

from connector.spark.planning import (
    LEDGER_OPEN_COST_BYTES,
    MAX_RUN_LEDGERS,
    IntRange,
    LedgerPartition,
    LedgerRun,
    LedgerSpan,
    ReadBounds,
    narrow_by_filter,
    pack_partitions,
    pieces_of,
    plan_partitions,
)

STREAM = [LedgerSpan(10, 9, 0, 99), LedgerSpan(11, 4, 100, 149), LedgerSpan(12, -1, 150, 149), LedgerSpan(13, 19, 150, 349)]


def ids(partitions):
    return [(p.ledger_id, p.first_entry, p.last_entry) for p in partitions]


def test_one_partition_per_ledger_skipping_empty_ones():
    parts = plan_partitions(STREAM, ReadBounds(), 0, offset_per_entry=False)
    assert ids(parts) == [(10, 0, 9), (11, 0, 4), (13, 0, 19)]
    assert [p.first_offset for p in parts] == [0, 100, 150]


def test_split_entries():
    parts = plan_partitions(STREAM, ReadBounds(), 4, offset_per_entry=False)
    assert ids(parts)[:4] == [(10, 0, 3), (10, 4, 7), (10, 8, 9), (11, 0, 3)]
    assert len(parts) == 3 + 2 + 5


def test_row_offsets_prune_whole_ledgers():
    parts = plan_partitions(STREAM, ReadBounds.from_offsets(120, 150), 0, offset_per_entry=False)
    assert ids(parts) == [(11, 0, 4)]
    parts = plan_partitions(STREAM, ReadBounds.from_offsets(99, None), 0, offset_per_entry=False)
    assert ids(parts) == [(10, 0, 9), (11, 0, 4), (13, 0, 19)]


def test_entry_offsets_clip_entry_ranges():
    raw = [LedgerSpan(1, 9, 0, 9), LedgerSpan(2, 9, 10, 19), LedgerSpan(3, 4, 20, None)]
    assert ids(plan_partitions(raw, ReadBounds.from_offsets(5, 13), 0, offset_per_entry=True)) == [(1, 5, 9), (2, 0, 2)]
    assert ids(plan_partitions(raw, ReadBounds.from_offsets(22, None), 0, offset_per_entry=True)) == [(3, 2, 4)]


def test_ledgers_read_by_id_have_no_offsets():
    spans = [LedgerSpan(7, 3), LedgerSpan(5, 0)]
    parts = plan_partitions(spans, ReadBounds(), 0, offset_per_entry=True)
    assert parts == [LedgerPartition(7, 0, 3, None), LedgerPartition(5, 0, 0, None)]


def test_pushed_filters_narrow_bounds():
    bounds = ReadBounds()
    bounds = bounds.pushed("ledgers", In(("_ledger_id",), (11, 13, 99)))
    bounds = bounds.pushed("offsets", GreaterThanOrEqual(("_offset",), 160))
    bounds = bounds.pushed("entries", LessThan(("_entry_id",), 3))
    assert ids(plan_partitions(STREAM, bounds, 0, offset_per_entry=False)) == [(13, 0, 2)]


def test_unsupported_filters_are_not_understood():
    assert narrow_by_filter(IntRange(), StringStartsWith(("x",), "a")) is None
    assert narrow_by_filter(IntRange(), EqualTo(("x",), "a")) is None
    assert narrow_by_filter(IntRange(), EqualTo(("x",), True)) is None
    assert narrow_by_filter(IntRange(), In(("x",), (1, "b"))) is None


def test_comparisons():
    r = IntRange()
    assert narrow_by_filter(r, GreaterThan(("x",), 5)) == IntRange(6, None)
    assert narrow_by_filter(r, LessThanOrEqual(("x",), 5)) == IntRange(None, 5)
    assert narrow_by_filter(r, EqualTo(("x",), 5)) == IntRange(5, 5)
    assert IntRange(values=frozenset()).clip(0, 10) is None


@given(
    lo=st.none() | st.integers(0, 60), hi=st.none() | st.integers(0, 60),
    values=st.none() | st.frozensets(st.integers(0, 60), max_size=5),
    span_lo=st.integers(0, 60), span_len=st.integers(0, 20),
)
def test_clip_keeps_exactly_the_bounded_values_within_the_span(lo, hi, values, span_lo, span_len):
    bounds = IntRange(lo, hi, values)
    span_hi = span_lo + span_len
    clipped = bounds.clip(span_lo, span_hi)
    inside = [v for v in range(span_lo, span_hi + 1) if bounds.contains(v)]
    if not inside:
        return
    assert clipped is not None and clipped[0] <= min(inside) and max(inside) <= clipped[1]
    assert span_lo <= clipped[0] and clipped[1] <= span_hi


@given(split=st.integers(0, 7), last=st.integers(-1, 40))
def test_split_partitions_cover_every_entry_once(split, last):
    parts = plan_partitions([LedgerSpan(1, last, 0, None)], ReadBounds(), split, offset_per_entry=False)
    covered = [e for p in parts for e in range(p.first_entry, p.last_entry + 1)]
    assert covered == list(range(last + 1))


MiB = 1024 * 1024


def small_ledgers(count: int, length: int, first_id: int = 1) -> list[LedgerSpan]:
    """count closed ledgers of 10 rows in one entry each, `length` bytes each, in stream order."""
    return [LedgerSpan(first_id + i, 0, 10 * i, 10 * i + 9, length) for i in range(count)]


def shape(packed):
    """Each partition as the ledger ids it reads: a LedgerRun as a tuple, a lone partition as an int."""
    return [tuple(p.ledger_id for p in part.pieces) if isinstance(part, LedgerRun) else part.ledger_id
            for part in packed]


def test_small_ledgers_are_packed_in_stream_order_up_to_max_bytes_counting_an_open_cost_each():
    spans = small_ledgers(10, 1000)
    parts = plan_partitions(spans, ReadBounds(), 0, offset_per_entry=False)
    # 4 MiB + 1000 bytes each: three fit in 16 MiB, a fourth would not
    assert shape(pack_partitions(parts, spans, 16 * MiB)) == [(1, 2, 3), (4, 5, 6), (7, 8, 9), 10]
    assert shape(pack_partitions(parts, spans, 128 * MiB)) == [tuple(range(1, 11))]
    assert shape(pack_partitions(parts, spans, 0)) == list(range(1, 11))   # 0: one partition per ledger


def test_large_ledgers_and_ledgers_of_unknown_length_stay_alone_and_end_a_run():
    spans = small_ledgers(2, 1000) + [LedgerSpan(3, 99, 20, 1019, 200 * MiB)] + small_ledgers(2, 1000, first_id=4) \
        + [LedgerSpan(6, 9, 40, None)]   # the OPEN tail: length unknown
    spans[4] = LedgerSpan(5, 0, 1030, 1039, 1000)
    parts = plan_partitions(spans, ReadBounds(), 0, offset_per_entry=False)
    assert shape(pack_partitions(parts, spans, 128 * MiB)) == [(1, 2), 3, (4, 5), 6]


def test_the_splits_of_a_ledger_stay_apart():
    spans = [LedgerSpan(1, 99, 0, 999, 10 * MiB)] + small_ledgers(2, 1000, first_id=2)
    parts = plan_partitions(spans, ReadBounds(), 10, offset_per_entry=False)   # splitEntries=10: ten splits
    assert shape(pack_partitions(parts, spans, 128 * MiB)) == [1] * 10 + [(2, 3)]


def test_a_run_holds_at_most_max_run_ledgers_and_knows_their_sizes():
    spans = small_ledgers(MAX_RUN_LEDGERS + 3, 10)
    parts = plan_partitions(spans, ReadBounds(), 0, offset_per_entry=False)
    packed = pack_partitions(parts, spans, 2 ** 40)
    assert [len(p.pieces) for p in packed] == [MAX_RUN_LEDGERS, 3]
    assert packed[1].sizes == (10, 10, 10)


@given(lengths=st.lists(st.one_of(st.none(), st.integers(0, 300 * MiB)), max_size=40),
       max_bytes=st.integers(0, 256 * MiB), split=st.sampled_from([0, 2, 5]))
def test_packing_keeps_every_partition_once_in_order_and_each_run_within_max_bytes(lengths, max_bytes, split):
    spans = [LedgerSpan(i + 1, 4, 5 * i, 5 * i + 4, -1 if length is None else length)
             for i, length in enumerate(lengths)]
    parts = plan_partitions(spans, ReadBounds(), split, offset_per_entry=False)
    packed = pack_partitions(parts, spans, max_bytes)
    planned = collections.Counter(p.ledger_id for p in parts)
    assert [piece for part in packed for piece in pieces_of(part)] == parts
    for part in packed:
        if isinstance(part, LedgerRun):
            assert 1 < len(part.pieces) <= MAX_RUN_LEDGERS
            assert all(planned[p.ledger_id] == 1 for p in part.pieces)   # a ledger split in several stays alone
            assert part.sizes == tuple(lengths[p.ledger_id - 1] for p in part.pieces)
            assert all(size is not None for size in part.sizes)
            assert sum(size + LEDGER_OPEN_COST_BYTES for size in part.sizes) <= max_bytes
