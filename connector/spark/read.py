"""Batch reads: the driver recovers and plans (partitions()), executors read entries and yield Arrow batches.

Offsets: an arrow stream has one offset per row, a raw stream one per entry (see commit.py). With
includeMetadata, pushed filters on the metadata columns narrow ReadBounds, which prune partitions;
Spark still evaluates every filter, so pruning only has to be conservative.

A read starting inside an arrow ledger is planned from the entry its row index names (planning.py); in
a ledger closed without an index, the executor finds the first entry it needs by a binary search over
single-entry reads (seek_entry), a few entries instead of every one below the start.

Time: with includeMetadata every row has _timestamp, its entry's append time (null for ledgers written before
entry times existed). startingTimestamp/endingTimestamp become offsets on the driver when the read is planned,
by a binary search over the stream's ledgers and then the entries of one (connector/client/time_search.py:
O(log) metadata and entry reads); pushed filters on _timestamp prune ledgers by the times recorded at their
close (planning.py).
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import datetime
import sys
import threading
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, Filter
from pyspark.sql.types import StructType

from connector.client import LedgerClient, NoSuchLedgerError
from connector.client.time_search import NoOffsetForTimeError, first_offset_at_or_after
from connector.spark import columns as cols
from connector.spark.data_loss import planned, read_or_lost
from connector.spark.encoding import decode_entry, entry_header
from connector.spark.errors import SchemaMismatchError
from connector.spark.options import LedgerOptions
from connector.spark.planning import (LedgerPartition, LedgerRun, LedgerSpan, ReadBounds, pack_partitions,
                                      pieces_of, plan_partitions)
from connector.spark.schema import (ENTRY_ID, LEDGER_ID, OFFSET, TIMESTAMP, arrow_schema_of,
                                   check_loaded_schema)
from connector.spark.spans import ledger_spans, stream_spans
from connector.spark.task_client import driver_client, read_client
from metadata.model import StreamRecord
from metadata.streams import iter_ledgers, read_stream

ARROW_ROLES = {(LEDGER_ID,): "ledgers", (ENTRY_ID,): "entries", (OFFSET,): "offsets", (TIMESTAMP,): "times"}
RAW_ROLES = {("ledger_id",): "ledgers", ("entry_id",): "entries", (OFFSET,): "offsets", (TIMESTAMP,): "times"}
RAW_BATCH_BYTES = 4 * 1024 * 1024
SEARCH_MIN_ENTRIES = 16  # fewer entries are read in one go sooner than searched one at a time


class LedgerReader(DataSourceReader):
    """Pickled to executors: holds options, the output schema and bounds, never a client."""

    def __init__(self, options: LedgerOptions, schema: StructType, raw: bool):
        self.options = options
        self.schema = schema
        self.raw = raw
        self.bounds = ReadBounds.from_offsets(options.starting_offset, options.ending_offset)

    def partitions(self) -> list[LedgerPartition | LedgerRun]:
        opts = self.options
        with driver_client(opts) as lc:
            if opts.ledgers:
                bounds, spans = self.bounds, ledger_spans(lc, opts.ledgers, opts.password, opts.recover)
            else:
                # startingOffsets below the stream's first offset, or a plan a truncation overtakes: failOnDataLoss
                bounds, spans = planned(lc.store, opts.stream, opts.starting_offset, opts.fail_on_data_loss,
                                        lambda record, _: self._stream_spans(lc, record))
        partitions = plan_partitions(spans, bounds, opts.split_entries, offset_per_entry=self.raw)
        if bounds.offsets != self.bounds.offsets:   # found when planning: the executors learn them from the partition
            partitions = [dataclasses.replace(p, lo=bounds.offsets.lo, hi=bounds.offsets.hi) for p in partitions]
        return pack_partitions(partitions, spans, opts.max_partition_bytes)

    def _stream_spans(self, lc: LedgerClient, record: StreamRecord) -> tuple[ReadBounds, list[LedgerSpan]]:
        if not self.raw:
            from connector.spark.datasource import read_schema
            check_loaded_schema(record.name, self.schema, read_schema(record, self.options.include_metadata))
        known: dict = {}
        last = record.last_ledger
        if self.options.has_times and last is not None and last.last_offset is None:
            # A dangling tail is recovered (and sealed) before the time search: the search reads an OPEN ledger up
            # to the nodes' LAC, and the recovery closes it further (the last add's LAC goes out with the next):
            # a search before it placed endingTimestamp past entries the read then took, at or after that time.
            record, _ = stream_spans(lc, record, [last], self.options.password, self.options.recover, known)
        bounds = self._timed_bounds(lc, record)
        if bounds is None:
            return self.bounds, []
        ledgers = iter_ledgers(lc.store, record, bounds.offsets.lo, bounds.offsets.hi)
        return bounds, stream_spans(lc, record, ledgers, self.options.password, self.options.recover, known)[1]

    def _timed_bounds(self, lc: LedgerClient, record: StreamRecord) -> ReadBounds | None:
        """The bounds with startingTimestamp/endingTimestamp turned into offsets (Kafka's offsetsForTimes);
        None if the read starts past the stream's end (no offset at or after startingTimestamp, strategy
        latest)."""
        opts, bounds = self.options, self.bounds
        if not opts.has_times:
            return bounds
        if opts.starting_timestamp is not None:
            start = first_offset_at_or_after(lc, record, opts.starting_timestamp, opts.password, entry_row(self.raw))
            if start is None:
                return no_offset_at(record.name, opts.starting_timestamp, opts.timestamp_strategy)
            bounds = bounds.with_offsets(lo=start)
        if opts.ending_timestamp is not None:
            end = first_offset_at_or_after(lc, record, opts.ending_timestamp, opts.password, entry_row(self.raw))
            if end is not None:   # else up to the end, as Kafka's endingTimestamp without a match
                bounds = bounds.with_offsets(hi=end - 1)
        return bounds

    def read(self, partition: LedgerPartition | LedgerRun) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, (LedgerPartition, LedgerRun)):
            return iter(())  # partitions() planned nothing (no rows, or all pruned): Spark reads a placeholder
        # This reader was pickled before partitions() ran: the offsets it planned (startingTimestamp...) are the
        # partition's.
        return read_partitions(self.options, self.schema, self.raw, partition,
                               lambda piece: self.bounds.with_offsets(piece.lo, piece.hi))


def entry_row(raw: bool):
    """For a time search: None for a raw stream (an entry is an offset), else an arrow entry's first row."""
    return None if raw else (lambda payload: entry_header(payload)[0])


def offset_at_time(lc: LedgerClient, options: LedgerOptions, raw: bool) -> int | None:
    """A streaming query's start for startingTimestamp: the stream's first offset at or after it; None with
    strategy latest when there is none (the query starts at the end); raises with strategy error. lc: the
    streaming source's own client (stream_read.py)."""
    record = read_stream(lc.store, options.stream).value
    found = first_offset_at_or_after(lc, record, options.starting_timestamp, options.password, entry_row(raw))
    return found if found is not None else no_offset_at(options.stream, options.starting_timestamp,
                                                        options.timestamp_strategy)


def no_offset_at(stream: str, time_ms: int, strategy: str) -> None:
    """startingTimestamp after the stream's last append time: error (Kafka's default), or None (latest: the read
    starts at the stream's end)."""
    if strategy == "latest":
        return None
    raise NoOffsetForTimeError(
        f"stream {stream!r} has no offset whose append time is at or after startingTimestamp={time_ms} "
        f"({_iso(time_ms)}): every row was appended before it; set startingOffsetsByTimestampStrategy=latest to "
        "start at the stream's end instead (a streaming query then reads what comes next)"
    )


def _iso(time_ms: int) -> str:
    try:
        return datetime.datetime.fromtimestamp(time_ms / 1000, datetime.timezone.utc).isoformat(timespec="milliseconds")
    except (OverflowError, ValueError, OSError):   # past year 9999, or past the platform's time_t
        return "a time past year 9999"


def read_partitions(options: LedgerOptions, schema: StructType, raw: bool, partition: LedgerPartition | LedgerRun,
                    bounds_of: Callable[[LedgerPartition], ReadBounds]) -> Iterator[pa.RecordBatch]:
    """An executor's read of a partition (a LedgerRun's ledgers one after the other, in order): their entries as
    Arrow batches of exactly the schema, within bounds_of(each), read through the worker's shared read client
    (task_client.py). The small ledgers of a run are fetched ahead of the one being decoded (_in_order): each
    costs a metadata read and a round trip to a node more than its bytes, and waiting for them one at a time
    left the task idle most of the time."""
    target = arrow_schema_of(schema)
    pieces = pieces_of(partition)
    sizes = partition.sizes if isinstance(partition, LedgerRun) else (-1,)
    with read_client(options) as lc, contextlib.closing(
            _in_order(lambda piece: _fetch(lc, options, raw, piece), pieces, sizes)
    ) as fetched:   # closed first: no prefetch uses the client once the task gives it back
        for piece, entries in zip(pieces, fetched):
            if raw:
                yield from raw_batches(entries, piece, target)
            else:
                yield from arrow_batches(entries, piece, target, bounds_of(piece),
                                         with_metadata=options.include_metadata)


PREFETCH_LEDGERS = 4
PREFETCH_BYTES = 32 * 1024 * 1024   # whatever maxPartitionBytes allows a run to hold


def _in_order(fetch: Callable[[LedgerPartition], Iterable], partitions: Sequence[LedgerPartition],
              sizes: Sequence[int]) -> Iterator[Iterable]:
    """fetch(partition) for each partition, in order. A lone partition's entries stream in as they are read. Those
    of a run (sizes: their bytes) are fetched whole by a pool, up to PREFETCH_LEDGERS and PREFETCH_BYTES ahead of
    the one handed over; a ledger larger than PREFETCH_BYTES streams in when its turn comes. A failure is raised at
    its partition's turn, as reading them one by one would. Closing this stops the prefetch: fetches not started
    are dropped, and those running (at most PREFETCH_LEDGERS, also when Spark stopped reading early) are waited
    for, unless the close comes from another thread (the collector finalising a dropped read), which must not
    wait for fetches that may need it."""
    if len(partitions) == 1:
        yield fetch(partitions[0])
        return
    owner = threading.current_thread()
    pool = concurrent.futures.ThreadPoolExecutor(PREFETCH_LEDGERS, thread_name_prefix="ledger-prefetch")
    queued = collections.deque(zip(partitions, sizes))
    pending: collections.deque = collections.deque()   # (the future of a ledger's entries, its bytes)

    def top_up() -> None:
        while queued and len(pending) < PREFETCH_LEDGERS and (
                sum(size for _, size in pending) + queued[0][1] <= PREFETCH_BYTES):
            partition, size = queued.popleft()
            pending.append((pool.submit(lambda p=partition: list(fetch(p))), size))

    try:
        while queued or pending:
            top_up()
            if not pending:
                yield fetch(queued.popleft()[0])
                continue
            entries = pending.popleft()[0].result()
            top_up()
            yield entries
    finally:
        pool.shutdown(wait=threading.current_thread() is owner, cancel_futures=True)


def _fetch(lc: LedgerClient, options: LedgerOptions, raw: bool, partition: LedgerPartition) -> Iterable:
    """The partition's entries (an empty list if its ledger was deleted and failOnDataLoss=false)."""
    # The driver planned up to a LAC it read: those entries were acknowledged, even if the nodes this
    # executor reaches know a lower LAC; so the handle takes that entry as confirmed and asks no node.
    try:
        handle = lc.open_ledger(partition.ledger_id, password=options.password, recover=False,
                                confirmed=partition.last_entry)
    except NoSuchLedgerError as exc:
        # Deleted since the driver planned: data loss if its offsets left the stream (failOnDataLoss).
        read_or_lost(lc.store, options.stream, partition.first_offset, options.fail_on_data_loss, exc)
        return []
    first = partition.first_entry if raw else seek_entry(handle, partition)
    return handle.read(first, partition.last_entry, views=True)   # decoded at once: no payload copies


def seek_entry(handle, partition: LedgerPartition) -> int:
    """The partition's first entry holding a row >= partition.seek_row (last_entry + 1 if none does), found
    by a binary search over single-entry reads: an entry's header tells the rows it holds. For arrow
    ledgers without a row index; partition.first_entry when there is nothing to seek."""
    lo, hi = partition.first_entry, partition.last_entry + 1
    row = partition.seek_row
    if row is None or hi - lo < SEARCH_MIN_ENTRIES:
        return lo
    while lo < hi:
        middle = (lo + hi) // 2
        entry = next(iter(handle.read(middle, middle, confirmed=partition.last_entry, views=True)))
        first_row, rows = entry_header(entry.payload)
        if first_row + rows > row:
            hi = middle
        else:
            lo = middle + 1
    return lo


class PruningLedgerReader(LedgerReader):
    """A reader with the metadata columns: filters on them prune partitions.

    Spark refuses any reader that implements pushFilters unless spark.sql.python.filterPushdown.enabled
    is true, so only reads that ask for the metadata columns (the only ones pushdown can use) get it, and
    only while that setting is on (pushdown_enabled).
    """

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        roles = RAW_ROLES if self.raw else ARROW_ROLES
        for flt in filters:
            role = roles.get(tuple(flt.attribute))
            narrowed = self.bounds.pushed(role, flt) if role else None
            if narrowed is not None:
                self.bounds = narrowed
            yield flt


def ledger_reader(options: LedgerOptions, schema: StructType, raw: bool) -> LedgerReader:
    pruning = options.include_metadata and pushdown_enabled() and pruning_is_scan_scoped()
    return (PruningLedgerReader if pruning else LedgerReader)(options, schema, raw)


def pruning_is_scan_scoped() -> bool:
    """Whether Spark keeps the read planned during filter pushdown (the pushed reader and its partitions) to
    the one scan that pushed the filters, so pruning by them is safe.

    Spark 4.x stores that plan on the DataFrame's data source object and reuses it for every later scan of
    the same DataFrame that pushes no filter of its own: a query filtering on _offset then a plain count of
    the same DataFrame read only the first query's partitions (22,048 of 40,000 rows). Spark scopes the plan
    to its scan in the change that adds DataSourceReader.pushLimit (SPARK-58551, Spark 5.0): its presence is
    the test. Without it, filters on the metadata columns are applied by Spark on every row (right answers,
    no pruning); startingOffsets/endingOffsets and startingTimestamp/endingTimestamp still narrow a read,
    since they belong to the DataFrame, not to one query."""
    return hasattr(DataSourceReader, "pushLimit")


# pyspark/sql/worker/: the worker that plans a Python data source read, and the one that pushes filters to
# its reader (started only while spark.sql.python.filterPushdown.enabled is on).
PLANNER, PUSHER = "plan_data_source_read.py", "data_source_pushdown_filters.py"


def pushdown_enabled() -> bool:
    """Whether Spark will ask this read for pushFilters (spark.sql.python.filterPushdown.enabled).

    Spark refuses a reader that implements pushFilters while the setting is off
    (DATA_SOURCE_PUSHDOWN_DISABLED), but does not tell DataSource.reader() which it is. Its workers do: the
    filter-pushing worker runs only while it is on, and the planning worker holds it in the local
    `enable_pushdown` of the function that calls reader(). Called from anywhere else (or by a pyspark that
    renamed them), the answer is no: the read then works either way, only without pruning (Spark still
    applies every filter itself)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(PUSHER):
            return True
        if frame.f_code.co_filename.endswith(PLANNER):
            return bool(frame.f_locals.get("enable_pushdown", False))
        frame = frame.f_back
    return False


def arrow_batches(entries, partition: LedgerPartition, target: pa.Schema, bounds: ReadBounds, *,
                  with_metadata: bool) -> Iterator[pa.RecordBatch]:
    """The rows of arrow entries within the offset bounds, as target; with_metadata (includeMetadata): with the
    metadata columns. Without it, a data column of such a name (a stream written from a read with
    includeMetadata) keeps its own values: it used to be overwritten with this read's."""
    lo, hi = bounds.offsets.lo, bounds.offsets.hi
    for entry in entries:
        rows = decode_entry(entry.payload)
        offset = partition.first_offset + rows.first_row
        if hi is not None and offset > hi:
            return  # offsets only grow from here on
        for batch in rows.batches:
            start = 0 if lo is None else min(batch.num_rows, max(0, lo - offset))
            end = batch.num_rows if hi is None else max(start, min(batch.num_rows, hi - offset + 1))
            if end > start:
                columns = dict(zip(batch.schema.names, batch.slice(start, end - start).columns))
                if with_metadata:
                    count = end - start
                    columns[LEDGER_ID] = cols.constant(partition.ledger_id, count)
                    columns[ENTRY_ID] = cols.constant(entry.entry_id, count)
                    columns[OFFSET] = cols.int64s(np.arange(offset + start, offset + end, dtype=np.int64))
                    columns[TIMESTAMP] = _time_column(entry.time_ms, count)   # one time for all rows of an entry
                yield assemble(columns, target)
            offset += batch.num_rows


def raw_batches(entries, partition: LedgerPartition, target: pa.Schema) -> Iterator[pa.RecordBatch]:
    """One row per entry: ledger id, entry id, payload (and the stream offset, null for a ledger read by id, and
    the append time, null for a ledger without entry times)."""
    entry_ids: list[int] = []
    payloads: list[bytes] = []
    times: list[int | None] = []
    size = 0
    for entry in entries:
        entry_ids.append(entry.entry_id)
        payloads.append(entry.payload)
        times.append(entry.time_ms)
        size += len(entry.payload)
        if size >= RAW_BATCH_BYTES:
            yield _raw_batch(entry_ids, payloads, times, partition, target)
            entry_ids, payloads, times, size = [], [], [], 0
    if entry_ids:
        yield _raw_batch(entry_ids, payloads, times, partition, target)


def _raw_batch(entry_ids: list[int], payloads: list[bytes], times: list[int | None], partition: LedgerPartition,
               target: pa.Schema) -> pa.RecordBatch:
    ids = np.asarray(entry_ids, dtype=np.int64)
    offsets = pa.nulls(len(ids), pa.int64()) if partition.first_offset is None else cols.int64s(ids + partition.first_offset)
    columns = {
        "ledger_id": cols.constant(partition.ledger_id, len(ids)),
        "entry_id": cols.int64s(ids),
        "payload": cols.binaries(payloads),
        OFFSET: offsets,
        TIMESTAMP: cols.times_of(times),
    }
    return assemble(columns, target)


def assemble(columns: dict[str, pa.Array], target: pa.Schema) -> pa.RecordBatch:
    """A batch with exactly the target schema (Spark checks it), taking columns by name."""
    arrays = []
    for field in target:
        if field.name not in columns:
            raise SchemaMismatchError(
                f"column {field.name!r} is not in the stream's entries (they have {sorted(columns)}); "
                "read without a user-given schema, or name existing columns"
            )
        column = columns[field.name]
        arrays.append(column if column.type.equals(field.type) else column.cast(field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def _time_column(time_ms: int | None, count: int) -> pa.Array:
    if time_ms is None:
        return pa.nulls(count, cols.TIMESTAMP_TYPE)
    return cols.timestamps(np.full(count, time_ms * 1000, dtype=np.int64))
