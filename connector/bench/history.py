"""`ledger bench history`: what a stream's history costs (issue 14, DESIGN rule 15), side by side in one run.

Two local clusters (embedded ZooKeeper and 3 storage nodes each, fsync on): an empty one, and one holding a
history built as fixtures through the metadata API (ledger metadata and stream pages; no entries, which
no commit reads): a stream of --ledgers closed sink-sized ledgers, its commit records at their bounds
(the last batch of query_commits.KEPT queries in their znodes, the outcome of JOBS_KEPT jobs in the head), and
--others ledgers of other streams. The driver-side code runs
here, without Spark, as Spark would call it; task ledgers are written by the code a Spark task runs
(write_task_ledger). Commits alternate between the two clusters, so that drift hits both alike.

- sink commit: LedgerStreamWriter.commit of a micro-batch of --tasks task ledgers, on the empty cluster's
  empty stream vs. on the history stream; target <= 1.3x.
- batch write commit: LedgerWriter.commit of a job of --tasks task ledgers, same two settings; <= 1.3x.
- seek: a streaming-source micro-batch (LedgerStreamReader.partitions, then read() of every partition as
  an executor runs it) of one row at the last row of a --size ledger vs. at its first row; <= 1.3x. Beside
  it the same micro-batch in the ledger once its row index is removed (a ledger written before the index:
  the executor's binary search), and as it was planned before the index (every entry from the first one).
- compaction: a batch read (every partition read as an executor reads it, one after another) of a stream
  of --small-ledgers sink-sized ledgers vs. the same rows after compaction (compact_stream, issue 14 item 4).
- node: a storage node's garbage-collection planning and checkpoint encoding on a node of --node-entries entries
  vs. one of a tenth of them (storage_node/history_bench.py, run as a process of its own); both <= 1.3x.

Every figure is a median of --rounds runs after WARM_UP unmeasured ones. Exit status 1 if a target is missed.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Callable

import numpy as np
import pyarrow as pa
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from connector.bench.task_context import StandInTask
from connector.client import LedgerClient
from connector.cluster import LocalCluster
from connector.commands.arguments import non_negative, positive, size
from connector.spark import LedgerDataSource
from connector.spark.commit import ARROW, JOBS_KEPT, TaskLedger
from connector.spark.jobs import job_registry, query_registry
from connector.spark.options import LedgerOptions
from connector.spark.recovery import ATTEMPT_TAG, PARTITION_TAG, STREAM_TAG, TASK_TAG
from connector.spark.row_index import ROW_INDEX_KEY
from connector.spark.schema import arrow_schema_of, encode_schema
from connector.spark import driver, task_client
from connector.spark.stream_options import StreamOptions
from connector.spark.stream_read import StreamPartition
from connector.spark.stream_write import BATCH_TAG, QUERY_TAG, LedgerStreamWriter
from connector.spark.write import LedgerWriter, write_task_ledger
from metadata import layout, query_commits, registry, serde
from metadata.embedded import DEFAULT_HEAP_MB, HEAP_ENV
from metadata.model import Fragment, LedgerMetadata, LedgerState, StreamLedger, StreamRecord
from metadata.store import MetadataStore
from metadata.streams import PAGE_LEDGERS, PAGES_PER_UPDATE, iter_ledgers, read_stream, update_stream
from metadata.update_loop import update_ledger
from protos.digest import password_hash

KiB = 1024
MiB = 1024 * KiB
TARGET = 1.3
WARM_UP = 2
SINK_ROWS = 100                 # rows of a sink-sized task ledger (a micro-batch's share of one task)
ROW_BYTES = 1000                # payload bytes per row of the seek ledger
FIXTURE_LEDGERS_PER_MULTI = 500  # ledger znodes created per ZooKeeper multi (about 300 KiB)
WRITERS = 4                     # threads writing the small ledgers (each a task with its own client)
HEAP_KIB_PER_LEDGER = 4         # ZooKeeper heap a fixture ledger takes (measured: 690 MiB for 200,000)
SCHEMA = StructType([StructField("id", LongType()), StructField("payload", BinaryType())])
HISTORY = "history"


def add_arguments(parser) -> None:
    parser.add_argument("--ledgers", type=positive, default=100_000, help="ledgers of the history stream")
    parser.add_argument("--others", type=non_negative, default=100_000, help="other ledgers in the history cluster")
    parser.add_argument("--tasks", type=positive, default=2, help="task ledgers per committed micro-batch or job")
    parser.add_argument("--rounds", type=positive, default=30, help="measured commits (and micro-batches) per setting")
    parser.add_argument("--size", type=size, default=1024 * MiB, help="bytes of the seek ledger (e.g. 1GiB, 64MiB)")
    parser.add_argument("--small-ledgers", type=positive, default=5_000,
                        help="sink-sized ledgers of the compaction read")
    parser.add_argument("--node-entries", type=positive, default=10_000_000,
                        help="entries of the larger node history (the smaller holds a tenth)")
    parser.add_argument("--quick", action="store_true",
                        help="small settings for a smoke run: 2,000 + 2,000 ledgers, 16 MiB, 100 small ledgers, "
                             "a node of 1,000,000 entries")


def run(args) -> int:
    if args.quick:
        args.ledgers, args.others, args.rounds, args.size, args.small_ledgers = 2_000, 2_000, 3, 16 * MiB, 100
        args.node_entries = 1_000_000
    ok = _compare_node_history(args.node_entries, args.rounds)
    # Both clusters' ZooKeeper gets the heap the history needs (the embedded default holds ~70,000 ledgers).
    os.environ.setdefault(HEAP_ENV, str(DEFAULT_HEAP_MB + (args.ledgers + args.others) * HEAP_KIB_PER_LEDGER // KiB))
    with tempfile.TemporaryDirectory(prefix="ledger-bench-history-") as tmp, \
            LocalCluster(f"{tmp}/empty") as empty_cluster, LocalCluster(f"{tmp}/history") as history_cluster:
        work = pathlib.Path(tmp)
        empty = Setting("empty", empty_cluster.metadata_uri, "fresh", work / "empty-checkpoint")
        history = Setting("history", history_cluster.metadata_uri, HISTORY, work / "history-checkpoint")
        built = _timed(lambda: build_history(history.uri, HISTORY, args.ledgers, args.others))
        print(f"history: a stream of {args.ledgers:,} ledgers (head {_head_bytes(history):,} bytes, commit records "
              f"at their bounds) in a cluster with {args.others:,} other ledgers, built in {built:.0f}s", flush=True)
        try:
            ok &= _compare_commits(empty, history, args)
            ok &= _compare_seek(empty.uri, args.size, args.rounds)
            _compare_compaction(empty.uri, args.small_ledgers)
        finally:
            task_client.close_shared()   # the reads' and commits' shared clients, while their ZooKeeper still runs
            driver.end_registrations()   # and the driver registrations the commits made
    return 0 if ok else 1


def _compare_node_history(entries: int, rounds: int) -> bool:
    """The storage node's own history (storage_node/history_bench.py); its lines printed once it ends."""
    done = subprocess.run([sys.executable, "-m", "storage_node.history_bench", "--entries", str(entries),
                           "--rounds", str(rounds)], stdout=subprocess.PIPE, text=True, check=False)
    print(done.stdout, end="", flush=True)
    return done.returncode == 0


# -- fixtures ------------------------------------------------------------------------------------------


def build_history(uri: str, stream: str, ledgers: int, others: int) -> None:
    """The history cluster: ledger metadata for a stream of `ledgers` closed sink-sized ledgers and for `others`
    ledgers of other streams (ids interleaved, as a busy cluster allocates them), and the stream's head and
    pages, written the way commits write them (update_stream, sealing pages as the tail grows)."""
    with MetadataStore(uri) as store:
        ensemble = tuple(sorted(registry.placeable_nodes(store)))[:3]
        ids = store.allocate_ledger_ids(ledgers + others)
        mine = set(np.linspace(0, len(ids) - 1, ledgers).round().astype(int).tolist()) if ledgers else set()
        stream_ids = [ledger_id for position, ledger_id in enumerate(ids) if position in mine]
        metas = [_sink_ledger(ledger_id, stream if position in mine else f"other-{position % 100}", ensemble)
                 for position, ledger_id in enumerate(ids)]
        for start in range(0, len(metas), FIXTURE_LEDGERS_PER_MULTI):
            request = store.transaction()
            for meta in metas[start:start + FIXTURE_LEDGERS_PER_MULTI]:
                request.create(layout.ledger_path(meta.ledger_id), serde.encode_ledger(meta))
            request.commit()
        head = StreamRecord(
            stream, format=ARROW, schema=encode_schema(arrow_schema_of(SCHEMA)), created_at=time.time(),
            jobs=tuple((uuid.uuid4().hex, "committed") for _ in range(JOBS_KEPT)),
        )
        update_stream(store, stream, lambda record: None, create=head)
        queries = store.transaction()
        for n in range(query_commits.KEPT):   # at the bound: the measured query's first commit evicts to LOW_WATER
            queries.create(layout.stream_query_path(stream, f"query-{uuid.uuid4()}"), query_commits.encode_batch(n))
        queries.commit()
        per_update = PAGE_LEDGERS * PAGES_PER_UPDATE
        for start in range(0, len(stream_ids), per_update):
            update_stream(store, stream, lambda record: _appended(record, stream_ids[start:start + per_update]))


def _sink_ledger(ledger_id: int, stream: str, ensemble: tuple[str, ...]) -> LedgerMetadata:
    """A closed one-entry ledger as a sink task leaves it."""
    tags = {STREAM_TAG: stream, QUERY_TAG: "query-history", BATCH_TAG: ledger_id // 2, PARTITION_TAG: ledger_id % 2,
            ATTEMPT_TAG: 0, TASK_TAG: ledger_id, ROW_INDEX_KEY: "1:1:1:AA=="}
    return LedgerMetadata(
        ledger_id=ledger_id, ensemble_size=3, write_quorum=3, ack_quorum=2, fragments=(Fragment(0, ensemble),),
        state=LedgerState.CLOSED, last_entry_id=0, length=SINK_ROWS * 110, password_hash=password_hash(b""),
        custom_metadata=tuple(sorted((k, str(v)) for k, v in tags.items())), writer_id=f"writer-{uuid.uuid4().hex}",
        created_at=time.time(),
    )


def _appended(record: StreamRecord, ledger_ids: list[int]) -> StreamRecord:
    offset = record.next_offset
    added = tuple(StreamLedger(i, offset + n * SINK_ROWS, offset + (n + 1) * SINK_ROWS - 1)
                  for n, i in enumerate(ledger_ids))
    return record.replace(tail=record.tail + added)


def _head_bytes(setting: "Setting") -> int:
    with MetadataStore(setting.uri) as store:
        return len(serde.encode_stream(read_stream(store, setting.stream).value))


# -- commits -------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Setting:
    """A cluster and the stream commits go to; the checkpoint directory holds the sink query's id."""

    name: str
    uri: str
    stream: str
    checkpoint: pathlib.Path
    batches: int = 0

    @property
    def options(self) -> LedgerOptions:
        return LedgerOptions.parse({"metadata": self.uri, "path": self.stream})

    def stream_options(self) -> StreamOptions:
        if not self.checkpoint.exists():
            self.checkpoint.mkdir(parents=True)
            (self.checkpoint / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))
        return StreamOptions(checkpoint_location=str(self.checkpoint))


def sink_commit_seconds(setting: Setting, tasks: int) -> float:
    """One micro-batch as Spark runs it on the sink: a fresh writer, task ledgers, then the timed commit."""
    opts, batch_id = setting.options, setting.batches
    setting.batches += 1
    writer = LedgerStreamWriter.prepare(opts, setting.stream_options(), SCHEMA)
    messages = [
        write_task_ledger(opts, writer.schema, iter([_sink_rows(writer.schema)]), task, writer._tags(task, batch_id),
                          query_registry(writer.query_id, batch_id))
        for task in map(StandInTask, range(tasks))
    ]
    return _timed(lambda: writer.commit(messages, batch_id))


def batch_commit_seconds(setting: Setting, tasks: int) -> float:
    """One batch write job: prepare, task ledgers, then the timed commit."""
    opts = setting.options
    writer = LedgerWriter.prepare(opts, SCHEMA, overwrite=False)
    messages = [
        write_task_ledger(opts, writer.schema, iter([_sink_rows(writer.schema)]), task, writer._tags(task),
                          job_registry(writer.job_id))
        for task in map(StandInTask, range(tasks))
    ]
    return _timed(lambda: writer.commit(messages))


def _compare_commits(empty: Setting, history: Setting, args) -> bool:
    ok = True
    for label, commit in (("sink commit", sink_commit_seconds), ("batch write commit", batch_commit_seconds)):
        times: dict[str, list[float]] = {empty.name: [], history.name: []}
        for _ in range(WARM_UP + args.rounds):
            for setting in (empty, history):
                times[setting.name].append(commit(setting, args.tasks))
        base, busy = (statistics.median(times[s.name][WARM_UP:]) for s in (empty, history))
        ok &= _report(f"{label}: {args.tasks} task ledgers, median of {args.rounds}: {_ms(base)} on an empty stream "
                      f"in an empty cluster, {_ms(busy)} on a stream of {args.ledgers:,} ledgers in a cluster with "
                      f"{args.others:,} other ledgers", busy / base)
    return ok


def _sink_rows(schema: pa.Schema) -> pa.RecordBatch:
    return _rows(schema, 0, SINK_ROWS, 100)


# -- seek ----------------------------------------------------------------------------------------------


def _compare_seek(uri: str, size: int, rounds: int) -> bool:
    stream = "seek"
    rows = max(2, size // ROW_BYTES)
    written = _timed(lambda: _write_one_ledger(uri, stream, rows))
    reader, ledger = _stream_reader(uri, stream)
    try:
        return _seek(uri, reader, ledger, rows, written, rounds)
    finally:
        reader.stop()   # its driver client, while ZooKeeper still runs


def _seek(uri: str, reader, ledger: StreamLedger, rows: int, written: float, rounds: int) -> bool:
    first, last = ledger.first_offset, ledger.last_offset
    entries = _meta(uri, ledger.ledger_id).last_entry_id + 1
    print(f"seek: a ledger of {rows * ROW_BYTES / MiB:,.0f} MiB ({rows:,} rows, {entries:,} entries) written in "
          f"{written:.0f}s", flush=True)

    def micro_batch(start: int) -> Callable[[], int]:
        return lambda: _read_rows(reader, reader.partitions({"offset": start}, {"offset": start + 1}))

    at_first, at_last = _alternating(micro_batch(first), micro_batch(last), rounds)
    ok = _report(f"seek: a streaming micro-batch of one row, median of {rounds}: {_ms(at_first)} at the first row "
                 f"of the ledger, {_ms(at_last)} at its last row", at_last / at_first)
    before = StreamPartition(ledger.ledger_id, 0, entries - 1, first, lo=last, hi=last)
    whole = _timed(lambda: _read_rows(reader, [before]))
    with LedgerClient(uri) as lc:
        update_ledger(lc.store, ledger.ledger_id, _without_row_index)
    searched = statistics.median(_timed(micro_batch(last)) for _ in range(rounds))
    print(f"  the same micro-batch at the last row, in the ledger without its row index (binary search): "
          f"{_ms(searched)}; planned from the first entry as before the index: {_ms(whole)}", flush=True)
    return ok


def _write_one_ledger(uri: str, stream: str, rows: int) -> None:
    opts = LedgerOptions.parse({"metadata": uri, "path": stream})
    writer = LedgerWriter.prepare(opts, SCHEMA, overwrite=False)
    per_batch = max(1, MiB // ROW_BYTES)
    batches = (_rows(writer.schema, start, min(per_batch, rows - start), ROW_BYTES)
               for start in range(0, rows, per_batch))
    task = StandInTask(0)
    message = write_task_ledger(opts, writer.schema, batches, task, writer._tags(task), job_registry(writer.job_id))
    writer.commit([message])


def _stream_reader(uri: str, stream: str):
    source = LedgerDataSource({"metadata": uri, "path": stream})
    reader = source.streamReader(source.schema())
    with MetadataStore(uri) as store:
        (ledger,) = iter_ledgers(store, read_stream(store, stream).value)
    return reader, ledger


def _without_row_index(meta: LedgerMetadata) -> LedgerMetadata:
    return meta.replace(custom_metadata=tuple(kv for kv in meta.custom_metadata if kv[0] != ROW_INDEX_KEY))


# -- compaction ----------------------------------------------------------------------------------------


def compact_stream(uri: str, stream: str) -> bool:
    """HOOK for compaction (issue 14 item 4, built concurrently in connector/compaction.py): rewrite the
    stream's small ledgers into large ones. Imported lazily, so that this benchmark runs without it;
    False (and "compact: not available") while it is not there."""
    try:
        from connector.compaction import compact_stream as compact
    except ImportError:
        return False
    with LedgerClient(uri) as lc:
        compact(lc, stream)
    return True


def _compare_compaction(uri: str, ledgers: int) -> None:
    stream = "small"
    written = _timed(lambda: _write_small_ledgers(uri, stream, ledgers))
    small = _timed(lambda: _batch_read(uri, stream))
    rows = ledgers * SINK_ROWS
    print(f"compaction: a batch read of {ledgers:,} sink-sized ledgers ({rows:,} rows, written in {written:.0f}s): "
          f"{small:.2f}s, {rows / small:,.0f} rows/s", flush=True)
    started = time.monotonic()
    if not compact_stream(uri, stream):
        print("compact: not available", flush=True)
        return
    compacted = time.monotonic() - started
    large = _timed(lambda: _batch_read(uri, stream))
    print(f"compaction: the same rows after compact ({compacted:.0f}s) in {_ledger_count(uri, stream):,} ledgers: "
          f"{large:.2f}s, {rows / large:,.0f} rows/s; {small / large:,.1f}x faster than before compact", flush=True)


def _write_small_ledgers(uri: str, stream: str, ledgers: int) -> None:
    """Sink-sized ledgers, committed by batch jobs of up to 100 tasks (written by WRITERS threads)."""
    opts = LedgerOptions.parse({"metadata": uri, "path": stream})
    with concurrent.futures.ThreadPoolExecutor(WRITERS) as pool:
        for start in range(0, ledgers, 100):
            writer = LedgerWriter.prepare(opts, SCHEMA, overwrite=False)

            def task_ledger(task: StandInTask, writer=writer) -> TaskLedger:
                return write_task_ledger(opts, writer.schema, iter([_sink_rows(writer.schema)]), task,
                                         writer._tags(task), job_registry(writer.job_id))

            writer.commit(list(pool.map(task_ledger, map(StandInTask, range(min(100, ledgers - start))))))


def _batch_read(uri: str, stream: str) -> int:
    source = LedgerDataSource({"metadata": uri, "path": stream})
    reader = source.reader(source.schema())
    return _read_rows(reader, reader.partitions())


def _ledger_count(uri: str, stream: str) -> int:
    with MetadataStore(uri) as store:
        return sum(1 for _ in iter_ledgers(store, read_stream(store, stream).value))


# -- helpers -------------------------------------------------------------------------------------------


def _rows(schema: pa.Schema, start: int, count: int, row_bytes: int) -> pa.RecordBatch:
    data = np.random.default_rng(start).integers(0, 256, count * row_bytes, dtype=np.uint8)
    offsets = np.arange(0, (count + 1) * row_bytes, row_bytes, dtype=np.int32)
    payload = pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    return pa.record_batch([pa.array(np.arange(start, start + count, dtype=np.int64)), payload], schema=schema)


def _read_rows(reader, partitions) -> int:
    return sum(batch.num_rows for partition in partitions for batch in reader.read(partition))


def _meta(uri: str, ledger_id: int) -> LedgerMetadata:
    with MetadataStore(uri) as store:
        return store.read_ledger(ledger_id).value


def _alternating(first: Callable[[], object], second: Callable[[], object], rounds: int) -> tuple[float, float]:
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(WARM_UP + rounds):
        times[0].append(_timed(first))
        times[1].append(_timed(second))
    return statistics.median(times[0][WARM_UP:]), statistics.median(times[1][WARM_UP:])


def _report(line: str, ratio: float) -> bool:
    met = ratio <= TARGET
    print(f"{line}; ratio {ratio:.2f} (target <= {TARGET}: {'met' if met else 'MISSED'})", flush=True)
    return met


def _timed(fn: Callable[[], object]) -> float:
    started = time.monotonic()
    fn()
    return time.monotonic() - started


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"
