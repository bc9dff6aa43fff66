"""Batch reads: the driver recovers and plans (partitions()), executors read entries and yield Arrow batches.

Offsets: an arrow stream has one offset per row, a raw stream one per entry (see commit.py). With
includeMetadata, pushed filters on the metadata columns narrow ReadBounds, which prune partitions;
Spark still evaluates every filter, so pruning only has to be conservative.

A read starting inside an arrow ledger is planned from the entry its row index names (planning.py); in
a ledger closed without an index, the executor finds the first entry it needs by a binary search over
single-entry reads (seek_entry), a few entries instead of every one below the start.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, Filter
from pyspark.sql.types import StructType

from connector.client import LedgerClient, NoSuchLedgerError
from connector.spark.data_loss import planned, read_or_lost
from connector.spark.encoding import decode_entry, entry_header
from connector.spark.errors import SchemaMismatchError
from connector.spark.options import LedgerOptions
from connector.spark.planning import LedgerPartition, LedgerSpan, ReadBounds, plan_partitions
from connector.spark.schema import ENTRY_ID, LEDGER_ID, METADATA_COLUMNS, OFFSET, arrow_schema_of
from connector.spark.spans import ledger_spans, stream_spans
from metadata.model import StreamRecord
from metadata.streams import iter_ledgers

ARROW_ROLES = {(LEDGER_ID,): "ledgers", (ENTRY_ID,): "entries", (OFFSET,): "offsets"}
RAW_ROLES = {("ledger_id",): "ledgers", ("entry_id",): "entries", (OFFSET,): "offsets"}
RAW_BATCH_BYTES = 4 * 1024 * 1024
SEARCH_MIN_ENTRIES = 16  # fewer entries are read in one go sooner than searched one at a time


class LedgerReader(DataSourceReader):
    """Pickled to executors: holds options, the output schema and bounds, never a client."""

    def __init__(self, options: LedgerOptions, schema: StructType, raw: bool):
        self.options = options
        self.schema = schema
        self.raw = raw
        self.bounds = ReadBounds.from_offsets(options.starting_offset, options.ending_offset)

    def partitions(self) -> list[LedgerPartition]:
        opts = self.options
        with LedgerClient(opts.metadata, **opts.client_options()) as lc:
            if opts.ledgers:
                spans = ledger_spans(lc, opts.ledgers, opts.password, opts.recover)
            else:
                # startingOffsets below the stream's first offset, or a plan a truncation overtakes: failOnDataLoss
                spans = planned(lc.store, opts.stream, opts.starting_offset, opts.fail_on_data_loss,
                                lambda record, _: self._stream_spans(lc, record))
        return plan_partitions(spans, self.bounds, opts.split_entries, offset_per_entry=self.raw)

    def _stream_spans(self, lc: LedgerClient, record: StreamRecord) -> list[LedgerSpan]:
        ledgers = iter_ledgers(lc.store, record, self.bounds.offsets.lo, self.bounds.offsets.hi)
        return stream_spans(lc, record, ledgers, self.options.password, self.options.recover)[1]

    def read(self, partition: LedgerPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, LedgerPartition):
            return iter(())  # partitions() planned nothing (no rows, or all pruned): Spark reads a placeholder
        return read_partition(self.options, self.schema, self.raw, partition, self.bounds)


def read_partition(
    options: LedgerOptions, schema: StructType, raw: bool, partition: LedgerPartition, bounds: ReadBounds
) -> Iterator[pa.RecordBatch]:
    """An executor's read of one partition: its entries as Arrow batches of exactly the schema."""
    target = arrow_schema_of(schema)
    with LedgerClient(options.metadata, **options.client_options()) as lc:
        try:
            handle = lc.open_ledger(partition.ledger_id, password=options.password, recover=False)
        except NoSuchLedgerError as exc:
            # Deleted since the driver planned: data loss if its offsets left the stream (failOnDataLoss).
            read_or_lost(lc.store, options.stream, partition.first_offset, options.fail_on_data_loss, exc)
            return
        # The driver planned up to a LAC it read: those entries were acknowledged, even if the nodes this
        # executor reaches know a lower LAC.
        first = partition.first_entry if raw else seek_entry(handle, partition)
        entries = handle.read(first, partition.last_entry, confirmed=partition.last_entry)
        if raw:
            yield from raw_batches(entries, partition, target)
        else:
            yield from arrow_batches(entries, partition, target, bounds)


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
        entry = next(iter(handle.read(middle, middle, confirmed=partition.last_entry)))
        first_row, rows = entry_header(entry.payload)
        if first_row + rows > row:
            hi = middle
        else:
            lo = middle + 1
    return lo


class PruningLedgerReader(LedgerReader):
    """A reader with the metadata columns: filters on them prune partitions.

    Spark refuses any reader that implements pushFilters unless spark.sql.python.filterPushdown.enabled
    is true, so only reads that ask for the metadata columns (the only ones pushdown can use) get it.
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
    return (PruningLedgerReader if options.include_metadata else LedgerReader)(options, schema, raw)


def arrow_batches(entries, partition: LedgerPartition, target: pa.Schema, bounds: ReadBounds) -> Iterator[pa.RecordBatch]:
    """The rows of arrow entries within the offset bounds, with the metadata columns, as target."""
    lo, hi = bounds.offsets.lo, bounds.offsets.hi
    with_metadata = not set(METADATA_COLUMNS).isdisjoint(target.names)
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
                    columns[LEDGER_ID] = _constant(partition.ledger_id, count)
                    columns[ENTRY_ID] = _constant(entry.entry_id, count)
                    columns[OFFSET] = pa.array(np.arange(offset + start, offset + end, dtype=np.int64))
                yield assemble(columns, target)
            offset += batch.num_rows


def raw_batches(entries, partition: LedgerPartition, target: pa.Schema) -> Iterator[pa.RecordBatch]:
    """One row per entry: ledger id, entry id, payload (and the stream offset, null for a ledger read by id)."""
    entry_ids: list[int] = []
    payloads: list[bytes] = []
    size = 0
    for entry in entries:
        entry_ids.append(entry.entry_id)
        payloads.append(entry.payload)
        size += len(entry.payload)
        if size >= RAW_BATCH_BYTES:
            yield _raw_batch(entry_ids, payloads, partition, target)
            entry_ids, payloads, size = [], [], 0
    if entry_ids:
        yield _raw_batch(entry_ids, payloads, partition, target)


def _raw_batch(entry_ids: list[int], payloads: list[bytes], partition: LedgerPartition, target: pa.Schema) -> pa.RecordBatch:
    ids = np.asarray(entry_ids, dtype=np.int64)
    offsets = pa.nulls(len(ids), pa.int64()) if partition.first_offset is None else pa.array(ids + partition.first_offset)
    columns = {
        "ledger_id": _constant(partition.ledger_id, len(ids)),
        "entry_id": pa.array(ids),
        "payload": pa.array(payloads, pa.binary()),
        OFFSET: offsets,
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


def _constant(value: int, count: int) -> pa.Array:
    return pa.array(np.full(count, value, dtype=np.int64))
