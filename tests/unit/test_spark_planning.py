"""connector/spark/planning.py: partitions per ledger or entry range, pruned by offsets and filters."""
from hypothesis import given, strategies as st
from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, LessThanOrEqual, StringStartsWith

from connector.spark.planning import IntRange, LedgerPartition, LedgerSpan, ReadBounds, narrow_by_filter, plan_partitions

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
