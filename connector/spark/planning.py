"""Read planning: which ledgers and entry ranges a read needs, as pure functions.

The driver turns the stream (or the ledgers named by the ledgers option) into LedgerSpans, narrows
ReadBounds with startingOffsets/endingOffsets and pushed-down filters on the metadata columns, and
plans one partition per ledger, or per splitEntries entries of a large ledger. A batch read or a micro-batch
then packs runs of small ledgers into one Spark partition each (pack_partitions), as Spark's file sources pack
small files: a streaming sink leaves one small ledger per task and micro-batch, and Spark spends about 50 ms of
a core on every Python task however little it reads.

A read that starts at offset k inside a ledger reads only the entries holding offsets >= k (rule 15): a
raw ledger has one offset per entry; an arrow ledger's row index (row_index.py) gives the entries of
its rows, and a ledger without one is planned whole with the row to seek to, which the executor finds
by a binary search (read.py).

Time: filters on _timestamp (pushed down, spark.sql.python.filterPushdown.enabled) narrow ReadBounds.times
(microseconds, Spark's timestamp unit), and a ledger whose first..last append time (recorded at its close,
connector/client/entry_time.py) lies outside them is not planned at all. A ledger without entry times (written
before they existed) has a null _timestamp on every row, which no comparison accepts: any _timestamp filter
prunes it. A ledger whose times are not recorded (the OPEN tail, one closed by a recovery) is always planned.
startingTimestamp/endingTimestamp become offsets before planning (read.py, time_search.py); the partitions
carry them (lo, hi), since the executors' reader was pickled before partitions() ran.
"""
from __future__ import annotations

import collections
import dataclasses
import datetime
from typing import Iterable

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

from connector.spark.row_index import RowIndex


@dataclasses.dataclass(frozen=True)
class IntRange:
    """Integers lo..hi (inclusive, None = unbounded), optionally only those in values."""

    lo: int | None = None
    hi: int | None = None
    values: frozenset[int] | None = None

    def narrowed(self, lo: int | None = None, hi: int | None = None, values: Iterable[int] | None = None) -> "IntRange":
        new_lo = self.lo if lo is None else (lo if self.lo is None else max(self.lo, lo))
        new_hi = self.hi if hi is None else (hi if self.hi is None else min(self.hi, hi))
        new_values = self.values
        if values is not None:
            values = frozenset(values)
            new_values = values if new_values is None else new_values & values
        return IntRange(new_lo, new_hi, new_values)

    @property
    def bounded(self) -> bool:
        return self.lo is not None or self.hi is not None or self.values is not None

    def contains(self, value: int) -> bool:
        return (
            (self.lo is None or value >= self.lo)
            and (self.hi is None or value <= self.hi)
            and (self.values is None or value in self.values)
        )

    def clip(self, lo: int, hi: int | None) -> tuple[int, int | None] | None:
        """The part of lo..hi (hi None = unbounded) inside this range's bounds, or None if empty."""
        bounds_lo, bounds_hi = self.lo, self.hi
        if self.values is not None:
            if not self.values:
                return None
            bounds_lo = max(min(self.values), bounds_lo) if bounds_lo is not None else min(self.values)
            bounds_hi = min(max(self.values), bounds_hi) if bounds_hi is not None else max(self.values)
        new_lo = lo if bounds_lo is None else max(lo, bounds_lo)
        if hi is None:
            new_hi = bounds_hi
        else:
            new_hi = hi if bounds_hi is None else min(hi, bounds_hi)
        if new_hi is not None and new_hi < new_lo:
            return None
        return new_lo, new_hi


def narrow_by_filter(bounds: IntRange, flt: Filter) -> IntRange | None:
    """bounds narrowed by a comparison of the column with an integer, or None if not understood."""
    if isinstance(flt, In):
        values = flt.value
        if not all(_is_int(v) for v in values):
            return None
        return bounds.narrowed(values=values)
    value = getattr(flt, "value", None)
    if not _is_int(value):
        return None
    if isinstance(flt, EqualTo):
        return bounds.narrowed(lo=value, hi=value)
    if isinstance(flt, GreaterThan):
        return bounds.narrowed(lo=value + 1)
    if isinstance(flt, GreaterThanOrEqual):
        return bounds.narrowed(lo=value)
    if isinstance(flt, LessThan):
        return bounds.narrowed(hi=value - 1)
    if isinstance(flt, LessThanOrEqual):
        return bounds.narrowed(hi=value)
    return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def micros(value: object) -> object:
    """A timestamp filter's value as microseconds since the epoch (Spark's unit); anything else unchanged. Spark
    hands TimestampType literals over as aware datetimes; a naive one (TIMESTAMP_NTZ) is read as UTC."""
    if isinstance(value, datetime.datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=datetime.timezone.utc)
        return (aware - EPOCH) // datetime.timedelta(microseconds=1)
    return value


def in_micros(flt: Filter) -> Filter | None:
    """The filter with its timestamp value(s) in microseconds, None if it has a value that is not a timestamp."""
    value = getattr(flt, "value", None)
    if isinstance(value, tuple):
        converted = tuple(micros(v) for v in value)
        return dataclasses.replace(flt, value=converted) if all(_is_int(v) for v in converted) else None
    converted = micros(value)
    return dataclasses.replace(flt, value=converted) if _is_int(converted) and not _is_int(value) else None


@dataclasses.dataclass(frozen=True)
class ReadBounds:
    """What a read is limited to: ledger ids, entry ids, stream offsets and append times (microseconds)."""

    ledgers: IntRange = IntRange()
    entries: IntRange = IntRange()
    offsets: IntRange = IntRange()
    times: IntRange = IntRange()

    @classmethod
    def from_offsets(cls, starting: int | None, ending: int | None) -> "ReadBounds":
        """startingOffsets is inclusive, endingOffsets exclusive (as in the Kafka source)."""
        return cls(offsets=IntRange(starting, None if ending is None else ending - 1))

    def with_offsets(self, lo: int | None = None, hi: int | None = None) -> "ReadBounds":
        """These bounds narrowed to offsets lo..hi (inclusive; None: no bound)."""
        return dataclasses.replace(self, offsets=self.offsets.narrowed(lo=lo, hi=hi))

    def pushed(self, role: str, flt: Filter) -> "ReadBounds | None":
        """These bounds narrowed by a filter on the column playing role ledgers/entries/offsets/times."""
        if role == "times":
            flt = in_micros(flt)
            if flt is None:
                return None
        narrowed = narrow_by_filter(getattr(self, role), flt)
        return None if narrowed is None else dataclasses.replace(self, **{role: narrowed})


@dataclasses.dataclass(frozen=True)
class LedgerSpan:
    """A ledger to read: entries 0..last_entry_id, holding stream offsets first_offset..last_offset.

    Offsets are None for a ledger read by id (not in a stream); last_offset is None while unknown
    (the OPEN tail of a live stream writer). length is the ledger's size in bytes, -1 while unknown.
    row_index: where the entries' rows start, for an arrow ledger closed with one.
    time_range: the first and last append time (ms) its writer recorded at close, None if unknown;
    untimed: its entries carry no times (every row's _timestamp is null).
    """

    ledger_id: int
    last_entry_id: int
    first_offset: int | None = None
    last_offset: int | None = None
    length: int = -1
    row_index: RowIndex | None = None
    time_range: tuple[int, int] | None = None
    untimed: bool = False


@dataclasses.dataclass(frozen=True)
class LedgerPartition(InputPartition):
    """Entries first_entry..last_entry of one ledger; first_offset is the ledger's first offset.
    seek_row: the first row (within the ledger) the read needs, for an arrow ledger without a row index:
    the executor skips the entries below it by a binary search. lo, hi: offsets the driver found when it planned
    (startingTimestamp...), which the executor keeps to as well as its reader's bounds (None: no such bound)."""

    ledger_id: int
    first_entry: int
    last_entry: int
    first_offset: int | None = None
    seek_row: int | None = None
    lo: int | None = None
    hi: int | None = None


@dataclasses.dataclass(frozen=True)
class LedgerRun(InputPartition):
    """Several small ledgers' partitions read one after the other by one Spark task, in stream order; sizes: each
    one's bytes (its ledger's length), which bound what the executor fetches ahead (read.py)."""

    pieces: tuple[LedgerPartition, ...]
    sizes: tuple[int, ...]


def pieces_of(partition: LedgerPartition | LedgerRun) -> tuple[LedgerPartition, ...]:
    """The ledger partitions a planned partition reads, in order."""
    return partition.pieces if isinstance(partition, LedgerRun) else (partition,)


# Spark's spark.sql.files.openCostInBytes: what opening one more ledger is counted as when packing, so that a
# partition holds at most max_bytes / LEDGER_OPEN_COST_BYTES ledgers however small they are.
LEDGER_OPEN_COST_BYTES = 4 * 1024 * 1024
MAX_RUN_LEDGERS = 256   # whatever maxPartitionBytes says: one task, one pickled partition of bounded size


def pack_partitions(partitions: list[LedgerPartition], spans: Iterable[LedgerSpan],
                    max_bytes: int) -> list[LedgerPartition | LedgerRun]:
    """partitions with each run of consecutive small ones packed into a LedgerRun of at most max_bytes (and
    MAX_RUN_LEDGERS), counting each as its ledger's bytes plus LEDGER_OPEN_COST_BYTES (Spark's file sources:
    maxPartitionBytes, openCostInBytes; below two open costs nothing is packed). These stay alone: a partition
    whose ledger's length is unknown (the OPEN tail, a ledger closed by a recovery, one read by id, those of a raw
    stream's micro-batch), one of max_bytes or more, and the splits of a ledger (splitEntries asked for them);
    max_bytes 0 packs nothing."""
    if max_bytes <= 0:
        return list(partitions)
    length = _lengths(spans, partitions)
    packed: list[LedgerPartition | LedgerRun] = []
    run: list[LedgerPartition] = []
    run_bytes = 0

    def close_run() -> None:
        if len(run) > 1:
            packed.append(LedgerRun(tuple(run), tuple(length(p) for p in run)))
        else:
            packed.extend(run)
        run.clear()

    for partition in partitions:
        size = length(partition)
        cost = None if size is None else size + LEDGER_OPEN_COST_BYTES
        if cost is None or cost >= max_bytes:
            close_run()
            packed.append(partition)
            run_bytes = 0
            continue
        if run and (run_bytes + cost > max_bytes or len(run) == MAX_RUN_LEDGERS):
            close_run()
            run_bytes = 0
        run.append(partition)
        run_bytes += cost
    close_run()
    return packed


def _lengths(spans: Iterable[LedgerSpan], partitions: list[LedgerPartition]):
    """partition -> its ledger's length in bytes; None for a split ledger or one of unknown length."""
    split = collections.Counter(p.ledger_id for p in partitions)
    known = {span.ledger_id: span.length for span in spans if span.length >= 0 and split[span.ledger_id] == 1}
    return lambda partition: known.get(partition.ledger_id)


def plan_partitions(
    spans: Iterable[LedgerSpan], bounds: ReadBounds, split_entries: int, offset_per_entry: bool
) -> list[LedgerPartition]:
    """Partitions in stream order. offset_per_entry: raw streams (offset = first_offset + entry id);
    otherwise offsets count rows, and the row index of an arrow ledger narrows its entries."""
    partitions = []
    for span in spans:
        entries = _entries_to_read(span, bounds, offset_per_entry)
        if entries is None:
            continue
        first, last = entries
        seek_row = None if offset_per_entry else _row_to_seek(span, bounds)
        step = split_entries or (last - first + 1)
        for start in range(first, last + 1, step):
            end = min(last, start + step - 1)
            partitions.append(LedgerPartition(span.ledger_id, start, end, span.first_offset, seek_row))
    return partitions


def _entries_to_read(span: LedgerSpan, bounds: ReadBounds, offset_per_entry: bool) -> tuple[int, int] | None:
    if span.last_entry_id < 0 or not bounds.ledgers.contains(span.ledger_id) or not _in_times(span, bounds.times):
        return None
    entries = bounds.entries.clip(0, span.last_entry_id)
    if entries is None:
        return None
    if span.first_offset is None:
        return entries
    if offset_per_entry:
        offsets = bounds.offsets.clip(span.first_offset + entries[0], span.first_offset + entries[1])
        if offsets is None:
            return None
        return offsets[0] - span.first_offset, offsets[1] - span.first_offset
    offsets = bounds.offsets.clip(span.first_offset, span.last_offset)
    if offsets is None:
        return None
    if span.row_index is None:
        return entries
    first, last = entries
    first = max(first, span.row_index.first_entry(offsets[0] - span.first_offset))
    if offsets[1] is not None:
        last = min(last, span.row_index.last_entry(offsets[1] - span.first_offset))
    return (first, last) if first <= last else None


def _in_times(span: LedgerSpan, times: IntRange) -> bool:
    """Whether rows of the span can pass the _timestamp filters that narrowed times."""
    if not times.bounded:
        return True
    if span.untimed:
        return False   # null _timestamp everywhere: no comparison holds
    if span.time_range is None:
        return True
    first, last = span.time_range
    return times.clip(first * 1000, last * 1000) is not None


def _row_to_seek(span: LedgerSpan, bounds: ReadBounds) -> int | None:
    """The row an executor seeks to in an arrow ledger without a row index: the read's first row in it."""
    if span.row_index is not None or span.first_offset is None:
        return None
    offsets = bounds.offsets.clip(span.first_offset, span.last_offset)
    if offsets is None or offsets[0] == span.first_offset:
        return None
    return offsets[0] - span.first_offset
