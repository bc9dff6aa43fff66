"""The tailing streaming source: spark.readStream.format("ledger").load("events").

Spark offsets are stream offsets ({"offset": n, "stream": name}: n is the next offset to read, and a
micro-batch reads [start, end)). The offset names its stream, as Kafka's names its topics, so that a
checkpoint tells which stream each source read (`ledger stream lag`), and a query restarted on another
stream with the same checkpoint is refused instead of reading the new stream from the old one's offsets.

The readable end of a stream is the end of its last sealed ledger, or, for the OPEN ledger of a live
stream writer, the entry its writer last confirmed (LAC) as the nodes know it: a row is visible only
once it is acknowledged, and never before. A dangling tail (writer gone) is recovered first, as for
batch reads; while the tail's LAC moves on, its writer is known alive without asking ZooKeeper, so a writer
gone since the last trigger is found (and its tail recovered) by the trigger after (spans.readable_end).

A micro-batch reads exactly the range its latestOffset promised (DESIGN rule 17): partitions(start,
end) plans from the offsets Spark hands it and the stream record, without reading a LAC again. The
end is a lower bound the data is known to reach, and a second LAC read could answer less (each node's
LAC lags its own way: a batch would be committed with rows never read). Executors read the OPEN tail
up to the planned entry whatever LAC the nodes they ask know.

Rate limits (maxRecordsPerTrigger, maxBytesPerTrigger) go through the ReadLimit API; with both
options set, both caps apply whenever Spark passes the source's default limit.

Admission (minOffsetsPerTrigger with maxTriggerDelay) is Kafka's, built here because the Python API has
no composite limit: latestOffset plans no batch while fewer than minOffsetsPerTrigger new offsets are
there, unless maxTriggerDelay has passed since this source last planned one (the first batch after the
query starts is never held back, as in Kafka). Holding back announces the start again: the end a batch
was promised is never taken back (rule 17). The caps then apply to a batch let through. Spark passing
ReadAllAvailable (Trigger.Once) and Trigger.AvailableNow, which must end, read without admission.

Deleted ledgers (offsets below the stream's first one, a plan or a read that a truncation overtakes:
data_loss.py), and promised offsets the stream no longer holds, fail the query unless failOnDataLoss is
false. After each batch the source logs its lag at INFO (connector/lag.py, as `ledger stream lag` prints
it), when that level is on for this module's logger.
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from connector.client import LedgerClient
from connector.lag import stream_lag
from connector.spark.data_loss import checked_start, data_lost, planned
from connector.spark.errors import InvalidOptionError
from connector.spark.options import LedgerOptions
from connector.spark.planning import (LedgerPartition, LedgerRun, LedgerSpan, ReadBounds, pack_partitions,
                                      plan_partitions)
from connector.spark.datasource import read_schema
from connector.spark.read import offset_at_time, read_partitions
from connector.spark.schema import check_loaded_schema
from connector.spark.spans import batch_spans, confirmed_past, stream_spans
from connector.spark.stream_options import LATEST, StreamOptions
from metadata.errors import LedgerError, NoSuchStreamError
from metadata.model import StreamRecord, recreated_since
from metadata.store import MetadataStore

log = logging.getLogger(__name__)

DEFAULT_BYTES_PER_OFFSET = 1024
EXTENT_LEDGERS = 16  # the most recent ledgers whose sizes estimate the bytes per offset (maxBytesPerTrigger)
TAIL_WAIT_SECONDS = 0.5  # how long latestOffset waits on a live writer's LAC when nothing new is there


@dataclasses.dataclass(frozen=True)
class StreamPartition(LedgerPartition):
    """A ledger's entries to read, and the stream offsets [lo, hi] of this micro-batch within them."""

    lo: int = 0
    hi: int = 0


@dataclasses.dataclass(frozen=True)
class StreamExtent:
    """What a stream holds right now: offsets [first, end) and the bytes per offset, on average."""

    first: int
    end: int
    bytes_per_offset: float
    open_tail: LedgerSpan | None = None   # a live writer's OPEN ledger of a raw stream, read up to its LAC
    created: float = 0.0                  # when the stream was created (0: before streams recorded it)


class RefusedStreamReader(DataSourceStreamReader):
    """The source of a streaming read that could not start (its options refused, say): it raises why from Spark's
    first call. pyspark's source runner (python_streaming_source_runner.main) stops the reader in a `finally` also
    when creating it raised, so an error raised by streamReader() reached the user as "UnboundLocalError: cannot
    access local variable 'reader'", the connector's message only earlier in the chain."""

    def __init__(self, refusal: Exception):
        self.refusal = refusal

    def initialOffset(self) -> dict:
        raise self.refusal

    def latestOffset(self, *args) -> dict:
        raise self.refusal

    def partitions(self, start: dict, end: dict):
        raise self.refusal

    def read(self, partition) -> Iterator:
        raise self.refusal


class LedgerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Pickled to executors for read(): holds options and the schema, never a client."""

    def __init__(self, options: LedgerOptions, stream_options: StreamOptions, schema: StructType, raw: bool):
        if options.ending_timestamp is not None:
            raise InvalidOptionError("endingTimestamp is for batch reads; a streaming query reads on as data arrives")
        self.options = options
        self.stream_options = stream_options
        self.schema = schema
        self.raw = raw
        self.available_now_end: int | None = None
        self.last_planned: float | None = None  # time.monotonic() when latestOffset last planned a batch
        self._schema_checked = ""                # the stream schema (encoded) last found to fit self.schema
        self._driver: _DriverSide | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_driver": None}   # executors get options and schema, never the driver's client

    # -- driver --------------------------------------------------------------------------------

    def _side(self) -> "_DriverSide":
        if self._driver is None:
            self._driver = _DriverSide(LedgerClient(self.options.metadata, **self.options.client_options()))
        return self._driver

    def _with_client(self, work):
        """work(client, ledger ends known) on the driver's client; a failure closes it (the next call opens a
        new one, so a client left broken by a ZooKeeper outage is never reused)."""
        side = self._side()
        try:
            return work(side.client, side.ends)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Spark's end of the query (also after a failure): the driver's client goes."""
        side, self._driver = self._driver, None
        if side is not None:
            side.client.close()

    def _extent(self) -> StreamExtent:
        """From the head and its most recent ledgers only: the cost does not grow with the stream (rule 15).
        The ends of closed ledgers are remembered between calls, so a call reads the head and the OPEN tail
        (its metadata once, and its LAC; spans.readable_end)."""
        opts = self.options

        def spans_of(lc: LedgerClient, known: dict) -> tuple[StreamRecord, list[LedgerSpan]]:
            record, spans = planned(lc.store, opts.stream, None, opts.fail_on_data_loss, lambda head, _: stream_spans(
                lc, head, head.tail[-EXTENT_LEDGERS:], opts.password, recover_dangling=True, known=known))
            for ledger_id in set(known) - {s.ledger_id for s in spans}:
                del known[ledger_id]   # only the recent ledgers' ends are kept
            return record, spans

        record, spans = self._with_client(spans_of)
        known = [s for s in spans if s.length > 0 and s.last_offset is not None]
        known_bytes = sum(s.length for s in known)
        known_offsets = sum(s.last_offset - s.first_offset + 1 for s in known)
        first = record.first_offset
        end = spans[0].first_offset if spans else first  # every ledger before the recent ones is sealed
        open_tail = None
        for span in spans:
            if span.last_offset is not None:
                end = span.last_offset + 1
            elif self.raw:
                end = span.first_offset + span.last_entry_id + 1  # a live writer's tail, up to its LAC
                open_tail = span
            # An arrow ledger's row offsets are known once it is sealed; until then it ends the stream.
        per_offset = known_bytes / known_offsets if known_offsets else DEFAULT_BYTES_PER_OFFSET
        self._side().created = record.created_at
        return StreamExtent(first, end, per_offset, open_tail, record.created_at)

    def _waited(self, extent: StreamExtent) -> StreamExtent:
        """Long poll: wait up to TAIL_WAIT_SECONDS for the live writer's LAC to pass what the extent read, so a
        new entry is seen as soon as it is confirmed rather than at Spark's next poll. The extent then ends at the
        LAC the wait returned, without reading the stream again: a LAC is a lower bound the tail's data reaches
        (rule 17), and a ledger the writer rolled to meanwhile is found by the next call."""
        opts, tail = self.options, extent.open_tail

        def wait(lc: LedgerClient, known: dict) -> int:
            read = known.get(tail.ledger_id)     # the metadata and the LAC the extent just read
            handle = lc.open_ledger(tail.ledger_id, password=opts.password, recover=False,
                                    confirmed=tail.last_entry_id, current=read.current if read else None)
            lac = handle.wait_lac(tail.last_entry_id, timeout=TAIL_WAIT_SECONDS)
            confirmed_past(known, tail.ledger_id, lac)   # the next trigger's floor, and its test of the writer
            return lac

        lac = self._with_client(wait)
        if lac <= tail.last_entry_id:
            return extent
        return dataclasses.replace(extent, end=tail.first_offset + lac + 1,
                                   open_tail=dataclasses.replace(tail, last_entry_id=lac))

    def initialOffset(self) -> dict:
        # startingTimestamp: the first offset at or after it (read.offset_at_time), None for the end (latest);
        # searched after the extent, which recovers a dangling tail: a search before it read the tail only up to the
        # nodes' LAC, and a last entry at or after the time was skipped (or "every row was appended before it")
        extent = self._extent()
        if self.options.starting_timestamp is not None:
            found = self._with_client(lambda lc, _: offset_at_time(lc, self.options, self.raw))
            # never past the end this source announces (rule 17)
            return self._offset(extent.end if found is None else min(found, extent.end), extent)
        starting = self.stream_options.starting
        if starting == LATEST:
            return self._offset(extent.end, extent)
        if isinstance(starting, int):
            if starting > extent.end:   # offsets only grow: a query there would wait for offsets never promised
                raise InvalidOptionError(
                    f"startingOffsets={starting} is past the end of stream {self.options.stream!r} (its next offset "
                    f"is {extent.end}): give an offset up to {extent.end}, or startingOffsets=latest to read only "
                    "what is appended from now on")
            return self._offset(starting, extent)
        return self._offset(extent.first, extent)

    def getDefaultReadLimit(self) -> ReadLimit:
        """A cap if one is set; else ReadMinRows for admission (so that Spark's ReadAllAvailable, for
        Trigger.Once, can still be told apart); else everything."""
        if self.stream_options.max_records_per_trigger is not None:
            return ReadMaxRows(self.stream_options.max_records_per_trigger)
        if self.stream_options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.stream_options.max_bytes_per_trigger)
        if self.stream_options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.stream_options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        at = self._stream_offset(start)
        try:
            extent = self._extent()
        except NoSuchStreamError as exc:   # deleted, perhaps to be created again: Kafka's deleted topic
            self._data_lost(f"stream {self.options.stream!r} is gone ({exc}); the query reads on once a stream of "
                            "that name exists again")
            return start
        if self._check_incarnation(start, extent.created):
            at = extent.first   # failOnDataLoss=false: the new stream from its start, none of which was read
        if extent.end <= at and extent.open_tail is not None and self.available_now_end is None:
            extent = self._waited(extent)
        self._side().latest_end = extent.end
        begin = self._checked_start(at, extent.first)
        end = extent.end
        tail = extent.open_tail
        if end < begin and tail is not None and tail.first_offset <= begin and start.get("ledger", tail.ledger_id) \
                == tail.ledger_id:
            # The query stands inside a live writer's OPEN ledger (the one its offset names), whose offsets only grow:
            # the end announced last came from a node whose LAC was ahead of the ones answering now (a restart, or
            # Trigger.AvailableNow, which does not wait for them to catch up). Nothing new yet; not offsets taken back.
            # (Another ledger there would mean its predecessor was closed below that end: a truncation, reported.)
            end = begin
        end = self._checked_extent(begin, end)
        if self.available_now_end is not None:
            end = min(end, self.available_now_end)
        if not isinstance(limit, ReadAllAvailable):
            if not self._admitted(end - begin):   # no new batch: the end announced last, never less (rule 17)
                return _unless_moved(start, self._offset(at, extent))
            caps = [self.stream_options.max_records_per_trigger,
                    _as_records(self.stream_options.max_bytes_per_trigger, extent)]
            if isinstance(limit, ReadMaxRows):
                caps.append(limit.max_rows)
            elif isinstance(limit, ReadMaxBytes):
                caps.append(_as_records(limit.max_bytes, extent))
            for cap in caps:
                if cap is not None:
                    end = min(end, begin + cap)
        end = max(begin, end)  # a cap below begin is no cap
        if end > at:
            self.last_planned = time.monotonic()
        return _unless_moved(start, self._offset(end, extent))

    def _admitted(self, available: int) -> bool:
        """Kafka's minOffsetsPerTrigger / maxTriggerDelay: whether a batch of the available offsets may be planned
        now. Not under Trigger.AvailableNow, which must reach its end and stop."""
        wanted = self.stream_options.min_offsets_per_trigger
        if wanted is None or self.available_now_end is not None or available >= wanted:
            return True
        if self.last_planned is None or time.monotonic() - self.last_planned >= self.stream_options.max_trigger_delay:
            return available > 0  # the delay passed: whatever is there goes (nothing: no batch to plan)
        return False

    def reportLatestOffset(self) -> dict:
        """The end the last latestOffset found (before caps and admission), as Kafka's source reports it: Spark
        asks after every latestOffset, for the query's progress, and a second extent would double its cost."""
        latest = self._side().latest_end
        return self._offset(self._extent().end if latest is None else latest)

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now_end = self._extent().end

    def _offset(self, offset: int, extent: StreamExtent | None = None) -> dict:
        """The offset as Spark checkpoints it: with the stream's creation time, which tells a stream deleted and
        created again under the same name (its offsets start again at 0) from the one the offset is of; and, inside
        a live writer's OPEN ledger (extent's), that ledger's id (latestOffset's staleness check)."""
        created = self._driver.created if self._driver is not None else 0.0
        tail = extent.open_tail if extent is not None else None
        inside = tail is not None and offset > tail.first_offset
        return {"offset": offset, "stream": self.options.stream, **({"created": created} if created else {}),
                **({"ledger": tail.ledger_id} if inside else {})}

    def _check_incarnation(self, offset: dict, created: float, report: bool = True) -> bool:
        """Data loss if the offset is of an earlier stream of the same name: read on from it, the query would skip
        the new stream's offsets below it, which hold rows it never read. Whether it is (then, unless this raised,
        failOnDataLoss=false: the query reads the new stream from its first offset, as Kafka's source goes on
        from where a recreated topic's partition starts)."""
        was = offset.get("created")
        if not recreated_since(was, created):
            return False
        if not report:
            return True
        self._data_lost(
            f"stream {self.options.stream!r} was deleted and created again since this query's checkpoint "
            f"(created at {_iso(was)}, now at {_iso(created)}): its offsets started again at 0, and the new "
            f"stream's offsets below {offset['offset']} would never be read; give the query a new "
            "checkpointLocation to read the new stream from its start (with failOnDataLoss=false the query reads "
            "the new stream from its start)"
        )
        return True

    def _stream_offset(self, offset: dict) -> int:
        """The offset Spark hands back, checked to be one of this stream's (the checkpoint may be another query's)."""
        stream = offset.get("stream", self.options.stream)
        if stream != self.options.stream:
            raise InvalidOptionError(
                f"this query reads stream {self.options.stream!r}, and its checkpoint holds offsets of stream "
                f"{stream!r}: offsets of one stream mean nothing in another. Read {stream!r} with this "
                "checkpoint, or give the query a new checkpointLocation"
            )
        return offset["offset"]

    def partitions(self, start: dict, end: dict) -> list[StreamPartition | LedgerRun]:
        """Offsets [start, end): exactly what latestOffset promised (rule 17), planned without a LAC read."""
        opts = self.options
        first, hi = self._stream_offset(start), self._stream_offset(end) - 1

        def plan(store: MetadataStore, record: StreamRecord, lo: int) -> tuple[int, list[LedgerSpan], int | None]:
            if not self.raw and record.schema != self._schema_checked:   # the query's schema: the one it started with
                check_loaded_schema(record.name, self.schema, read_schema(record, opts.include_metadata))
                self._schema_checked = record.schema   # a micro-batch of the same schema compares two strings
            if self._check_incarnation(start, record.created_at):   # failOnDataLoss=false from here on
                if self._check_incarnation(end, record.created_at, report=False):
                    return hi + 1, [], None   # a batch planned on the old stream (replayed): its rows are gone
                lo = record.first_offset      # a batch of the new stream, from its start
            return (lo, *batch_spans(store, record, lo, hi)) if lo <= hi else (lo, [], None)

        try:
            lo, spans, reach = self._with_client(
                lambda lc, _: planned(lc.store, opts.stream, first, opts.fail_on_data_loss,
                                      lambda record, lo: plan(lc.store, record, lo)))
        except NoSuchStreamError as exc:   # deleted since latestOffset promised the batch (or before its replay)
            self._data_lost(f"stream {opts.stream!r} was deleted after this micro-batch was planned: its offsets "
                            f"{first}..{hi} are gone ({exc})")
            return []
        if hi < lo:
            return []
        hi = self._checked_end(lo, hi, reach)
        bounds = ReadBounds.from_offsets(lo, hi + 1)
        partitions = [StreamPartition(p.ledger_id, p.first_entry, p.last_entry, p.first_offset, p.seek_row,
                                      lo=lo, hi=hi)
                      for p in plan_partitions(spans, bounds, opts.split_entries, offset_per_entry=self.raw)]
        return pack_partitions(partitions, spans, opts.max_partition_bytes)   # the sealed ledgers of a sink

    def _checked_start(self, offset: int, first: int) -> int:
        """Offsets below the stream's first one belong to deleted ledgers (failOnDataLoss)."""
        return checked_start(self.options.stream, offset, first, self.options.fail_on_data_loss)

    def _checked_extent(self, begin: int, end: int) -> int:
        """Offsets only grow (rule 17): a stream that now ends below where this query stands had offsets
        taken back, and rows written from there would reuse offsets the query already passed."""
        if end >= begin:
            return end
        self._data_lost(
            f"stream {self.options.stream!r} now ends at offset {end}, below offset {begin} where this query "
            "stands: offsets were taken back (its ledgers were replaced or deleted)"
        )
        return begin

    def _checked_end(self, lo: int, hi: int, reach: int | None) -> int:
        """The promised end, unless the stream no longer holds it (its ledgers were replaced meanwhile)."""
        if reach is None or reach >= hi:
            return hi
        self._data_lost(
            f"stream {self.options.stream!r}: offsets {max(lo, reach + 1)}..{hi}, promised to this micro-batch, "
            f"are no longer in the stream (it now ends at offset {reach}: were its ledgers overwritten?)"
        )
        return reach

    def _data_lost(self, message: str) -> None:
        data_lost(message, self.options.fail_on_data_loss)

    def commit(self, end: dict) -> None:
        """Nothing to release (a stream keeps its ledgers until they are deleted); logs the query's lag."""
        if log.isEnabledFor(logging.INFO):
            self._log_lag(self._stream_offset(end))

    def _log_lag(self, committed: int) -> None:
        """The lag after this batch, as `ledger stream lag` prints it; a failure to learn it fails nothing."""
        opts = self.options
        try:
            lag = self._with_client(lambda lc, _: stream_lag(lc, opts.stream, committed, opts.password))
        except LedgerError as exc:
            log.info("stream %r: committed offset %d; lag unknown: %s", opts.stream, committed, exc)
            return
        log.info("%s", lag.describe())

    # -- executors -----------------------------------------------------------------------------

    def read(self, partition: StreamPartition | LedgerRun) -> Iterator[pa.RecordBatch]:
        return read_partitions(self.options, self.schema, self.raw, partition,
                               lambda piece: ReadBounds.from_offsets(piece.lo, piece.hi + 1))


@dataclasses.dataclass
class _DriverSide:
    """What the source keeps in the driver's Python process between Spark's calls (one per query): a client,
    the ends of the recent ledgers (spans.readable_end) and the stream's end the last latestOffset found."""

    client: LedgerClient
    ends: dict = dataclasses.field(default_factory=dict)
    latest_end: int | None = None
    created: float = 0.0   # the stream's creation time, as the last extent read it


def _as_records(max_bytes: int | None, extent: StreamExtent) -> int | None:
    if max_bytes is None:
        return None
    return max(1, int(max_bytes // max(extent.bytes_per_offset, 1.0)))


def _unless_moved(start: dict, offset: dict) -> dict:
    """start when offset is the same place (only the OPEN ledger it names differs: the writer rolled or closed it):
    Spark compares offsets as they are, and a differing one alone would plan an empty micro-batch."""
    def place(o: dict) -> dict:
        return {key: value for key, value in o.items() if key != "ledger"}
    return start if place(start) == place(offset) else offset


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat(timespec="seconds")
