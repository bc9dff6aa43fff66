"""`ledger bench stream`: streaming end-to-end latency, and sink throughput beside the batch writer's.

Starts a local cluster (embedded ZooKeeper + 3 storage nodes) and Spark in local mode.

- Latency: a stream writer appends entries at a steady rate while a streaming query tails the stream;
  for each entry, the time from its append being acknowledged to its row reaching the query's output
  (foreachBatch on the driver). Printed as p50 and p99, beside the same run over the ceiling
  (connector/bench/stream_ceiling.py: a minimal Python streaming source over a local file, same
  trigger, same sink, rows of the same columns), and their ratio. Both are measured after warm-up appends of
  their own, twice, in alternating order, after a query that neither measures (_print_latency says why); the
  ledger query's first row after its start is printed apart.
  The same queries then measure a sparse stream (--sparse-rate, 2 appends/s), where an entry's visibility to
  a tailing reader rests on the writer's explicit LAC rather than on its next add.
- Sink against Spark's own exactly-once sink: a rate source into the ledger sink and into the parquet
  file sink (checkpointed), same trigger, same run: committed rows/s at a rate neither keeps up with
  (--sink-fast-rate), and the median micro-batch at a rate both keep up with (--sink-rate).
- Throughput: the same rows written by the exactly-once streaming sink (one Trigger.AvailableNow
  micro-batch over a parquet directory) and by the batch writer (df.write.format("ledger")), side by
  side in the same run, as rows/s and their ratio.
- Sink commit vs. cluster size: the median addBatch of a rate -> ledger query on the fresh cluster, and
  again once the cluster holds --unrelated ledgers of other jobs and queries (metadata only, which is
  all a commit's orphan sweep could look at). Rule 15: the ratio stays near 1.
"""
from __future__ import annotations

import itertools
import statistics
import tempfile
import threading
import time

from connector.bench.stream_ceiling import CeilingStreamDataSource, append_record
from connector.client import LedgerClient, Streams
from connector.cluster import LocalCluster
from connector.commands.arguments import non_negative, positive, positive_number, seconds, seconds_or_zero
from metadata import registry
from metadata.model import Fragment, LedgerMetadata, LedgerState
from metadata.store import MetadataStore

WARM_UP_ENTRIES = 3  # rows a latency query gets at least before it is measured (its first batch starts Python workers)
WARM_UP_BATCHES = 3  # micro-batches left out of the commit medians (Spark compiles and caches on the first ones)


def add_arguments(parser) -> None:
    parser.add_argument("--entries", type=positive, default=300,
                        help="entries measured per source in the latency runs (half in each of two rounds)")
    parser.add_argument("--rate", type=positive_number, default=50.0, help="appends per second for the latency runs")
    parser.add_argument("--warm-up-seconds", type=seconds_or_zero, default=5.0,
                        help="appends at --rate each latency query gets before it is measured")
    parser.add_argument("--sparse-entries", type=positive, default=40,
                        help="entries measured per source in the latency runs of a sparse stream")
    parser.add_argument("--sparse-rate", type=positive_number, default=2.0,
                        help="appends per second of the sparse stream (an idle writer between appends)")
    parser.add_argument("--rows", type=positive, default=500_000, help="rows for the throughput runs")
    parser.add_argument("--unrelated", type=non_negative, default=2_000,
                        help="other ledgers in the cluster for the commit run")
    parser.add_argument("--commit-batches", type=positive, default=15, help="micro-batches measured per commit run")
    parser.add_argument("--sink-seconds", type=seconds, default=20.0, help="measured time of each sink run")
    parser.add_argument("--sink-rate", type=positive, default=200_000, help="rows/s offered for the batch-median runs")
    parser.add_argument("--sink-fast-rate", type=positive, default=1_500_000,
                        help="rows/s offered for the throughput runs (more than either sink keeps up with)")


def run(args) -> int:
    from connector.demo.sample import sample_dataframe
    from connector.demo.session import local_session

    with tempfile.TemporaryDirectory(prefix="ledger-bench-stream-") as tmp, LocalCluster(f"{tmp}/cluster") as cluster:
        uri = cluster.metadata_uri
        spark = local_session("ledger-bench-stream")
        spark.dataSource.register(CeilingStreamDataSource)
        try:
            _print_latency(spark, uri, tmp, [(args.entries, args.rate), (args.sparse_entries, args.sparse_rate)],
                           args.warm_up_seconds)
            _print_sinks(spark, uri, tmp, args)

            rows = sample_dataframe(spark, args.rows, partitions=2)
            rows.write.parquet(f"{tmp}/source")
            sink = _timed(lambda: _sink_write(spark, uri, f"{tmp}/source", f"{tmp}/ck", "sink-bench"))
            batch = _timed(lambda: spark.read.parquet(f"{tmp}/source").write.format("ledger")
                           .option("metadata", uri).mode("append").save("batch-bench"))
            print(f"stream sink: {args.rows / sink:,.0f} rows/s; batch writer: {args.rows / batch:,.0f} rows/s; "
                  f"sink/batch ratio {batch / sink:.2f} (same rows, E=3 WQ=3 AQ=2, fsync on)")

            # Last, with Spark warm: the cluster holds only the few ledgers of the runs above, then many more.
            empty = _median_add_batch(spark, uri, f"{tmp}/commit-empty-ck", "commit-empty", args.commit_batches)
            with MetadataStore(uri) as store:
                _unrelated_ledgers(store, args.unrelated)
            busy = _median_add_batch(spark, uri, f"{tmp}/commit-busy-ck", "commit-busy", args.commit_batches)
            print(f"sink commit: median addBatch of a rate -> ledger micro-batch {empty:.0f} ms on a fresh cluster, "
                  f"{busy:.0f} ms with {args.unrelated:,} unrelated ledgers; ratio {busy / empty:.2f} (target <= 1.3)")
        finally:
            spark.stop()
    return 0


def _print_latency(spark, uri: str, tmp: str, phases: list[tuple[int, float]], warm_up_seconds: float) -> None:
    """Steady-state latency of the ledger source and of the ceiling, measured alike: each query first gets
    warm_up_seconds of appends at the first phase's rate that are not measured (its first batch starts Python
    workers, and the JVM compiles Spark's streaming paths on the first batches), and the two are measured twice,
    in the order ledger, ceiling and then ceiling, ledger, so that neither gains from running second, after a ceiling
    query that neither measures (the application's first streaming query runs slower than any after it; none with
    warm_up_seconds 0). Each query runs the phases one after the other, (entries, rate) each: the steady rate, then
    the sparse stream, whose entries' visibility rests on the writer's explicit LAC. The entries of both of a
    source's runs are pooled, phase by phase. The ledger query's first row after its start is printed apart."""
    records = f"{tmp}/ceiling-records"
    positions = itertools.count()

    def append_ceiling(i: int) -> int:
        append_record(records, _latency_payload(i))
        return next(positions)  # the ceiling's offset is the record's position in the file

    measured: dict[str, list[list[float]]] = {"ledger": [[] for _ in phases], "ceiling": [[] for _ in phases]}
    first_row = None   # the ledger query's first row after its start, in the first round
    halves = [(max(1, entries // 2), rate) for entries, rate in phases]
    with LedgerClient(uri) as lc:
        writer = Streams(lc).open_writer("latency-bench")
        try:
            writer.append(b"warm-up")   # the stream exists before the query starts
            sources = {
                "ledger": (lambda: spark.readStream.format("ledger").option("metadata", uri)
                           .option("includeMetadata", "true").option("startingOffsets", "latest")
                           .load("latency-bench"), lambda i: writer.append(_latency_payload(i))),
                "ceiling": (lambda: spark.readStream.format(CeilingStreamDataSource.name()).option("path", records)
                            .load(), append_ceiling),
            }
            if warm_up_seconds > 0:
                # The application's first streaming query also compiles Spark's streaming paths in the JVM: a
                # ceiling query takes that, measured by neither (without warm-up, both are measured cold).
                ceiling_reader, _ = sources["ceiling"]
                _latency(ceiling_reader(), f"{tmp}/latency-jvm-warm-up-ck", [(WARM_UP_ENTRIES, halves[0][1])],
                         append_ceiling, warm_up_seconds)
            for round_, order in enumerate((("ledger", "ceiling"), ("ceiling", "ledger"))):
                for name in order:
                    reader, append = sources[name]
                    warm_up, latencies = _latency(reader(), f"{tmp}/latency-{name}-{round_}-ck", halves, append,
                                                  warm_up_seconds)
                    for pooled, phase in zip(measured[name], latencies):
                        pooled += phase
                    if name == "ledger" and first_row is None:
                        first_row = warm_up[0]
        finally:
            writer.close()
    for phase, (_entries, rate) in enumerate(phases):
        ledger, ceiling = measured["ledger"][phase], measured["ceiling"][phase]
        (p50, p99), (c50, c99) = _percentiles(ledger), _percentiles(ceiling)
        print(f"stream latency{', a sparse stream' if phase else ''}: append acknowledged -> row in a streaming "
              f"query's output, {len(ledger)} entries at {rate:g}/s: p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} "
              f"ms; ceiling (a minimal Python streaming source, same trigger and sink) p50 {c50 * 1000:.0f} ms, p99 "
              f"{c99 * 1000:.0f} ms; p50 ratio {p50 / c50:.2f} (target <= 1.5), p99 {'<=' if p99 <= 1.0 else 'ABOVE'} "
              f"1 s" + ("" if phase else f"; the ledger query's first row after its start {first_row * 1000:.0f} ms"))


def _latency_payload(i: int) -> bytes:
    """The latency runs' i-th entry (the ledger's) or record (the ceiling's)."""
    return f"entry {i}".encode()


def _latency(reader, checkpoint: str, phases: list[tuple[int, float]], append,
             warm_up_seconds: float = 0.0) -> tuple[list[float], list[list[float]]]:
    """Per entry: time from append(i) returning its offset (acknowledged) to its row reaching foreachBatch; for
    the warm-up entries appended at the first phase's rate once the query runs (warm_up_seconds' worth, at least
    WARM_UP_ENTRIES: not measured; the first starts the query's Python workers), and for the entries of each
    phase after them ((entries, rate) each, a phase once the one before it was seen whole)."""
    acked: dict[int, float] = {}
    seen: dict[int, float] = {}
    lock = threading.Lock()

    def collect(batch_df, batch_id) -> None:
        now = time.monotonic()
        with lock:
            for row in batch_df.select("_offset").collect():
                seen.setdefault(row[0], now)

    def appended(i: int) -> int:
        offset = append(i)
        acked[offset] = time.monotonic()
        return offset

    def paced(count: int, first: int, rate: float) -> list[int]:
        offsets, next_at = [], time.monotonic()
        for i in range(first, first + count):
            offsets.append(appended(i))
            next_at += 1.0 / rate
            time.sleep(max(0.0, next_at - time.monotonic()))
        _wait(lambda: all(o in seen for o in offsets), 120)
        return offsets

    query = (reader.writeStream.foreachBatch(collect).trigger(processingTime="0 seconds")
             .option("checkpointLocation", checkpoint).start())
    try:
        _wait(lambda: query.lastProgress is not None, 120)
        warm_up = paced(max(WARM_UP_ENTRIES, int(warm_up_seconds * phases[0][1])), -1_000_000, phases[0][1])
        measured, first = [], 0
        for entries, rate in phases:
            measured.append(paced(entries, first, rate))
            first += entries
    finally:
        query.stop()
    return [seen[o] - acked[o] for o in warm_up], [[seen[o] - acked[o] for o in phase] for phase in measured]


def _print_sinks(spark, uri: str, tmp: str, args) -> None:
    """The ledger sink beside Spark's parquet file sink: rate source, same trigger, same run."""
    figures = {}
    for sink in ("parquet", "ledger"):
        figures[sink] = (_sink_run(spark, uri, f"{tmp}/{sink}-fast", sink, args.sink_fast_rate, args.sink_seconds),
                         _sink_run(spark, uri, f"{tmp}/{sink}-steady", sink, args.sink_rate, args.sink_seconds))
    (p_rate, _), (_, p_median) = figures["parquet"]
    (l_rate, _), (_, l_median) = figures["ledger"]
    print(f"stream sink vs parquet file sink (rate source, trigger as fast as possible): at {args.sink_fast_rate:,} "
          f"rows/s offered, ledger {l_rate:,.0f} rows/s, parquet {p_rate:,.0f} rows/s, ratio {l_rate / p_rate:.2f} "
          f"(target >= 0.8); at {args.sink_rate:,} rows/s, median batch ledger {l_median:.0f} ms, parquet "
          f"{p_median:.0f} ms, ratio {l_median / p_median:.2f} (target <= 1.5)")


def _sink_run(spark, uri: str, base: str, sink: str, rate: int, seconds: float) -> tuple[float, float]:
    """(committed rows/s, median batch ms) of a rate -> sink query over `seconds` after its warm-up batches."""
    writer = (spark.readStream.format("rate").option("rowsPerSecond", rate).load()
              .writeStream.option("checkpointLocation", f"{base}/ck").trigger(processingTime="0 seconds"))
    if sink == "ledger":
        query = writer.format("ledger").option("metadata", uri).start(base.rsplit("/", 1)[-1])
    else:
        query = writer.format("parquet").option("path", f"{base}/out").start()
    try:
        _wait(lambda: len(query.recentProgress) >= WARM_UP_BATCHES, 600)
        warm = query.lastProgress["batchId"]
        started = time.monotonic()
        time.sleep(seconds)   # the measured window: the query runs on its own meanwhile
        progress = [p for p in query.recentProgress if p["batchId"] > warm and p["numInputRows"] > 0]
        elapsed = time.monotonic() - started
    finally:
        query.stop()
    if not progress:
        raise RuntimeError(f"the {sink} sink committed no micro-batch in {seconds:g}s")
    rows = sum(p["numInputRows"] for p in progress)
    return rows / elapsed, statistics.median(p["durationMs"]["triggerExecution"] for p in progress)


def _sink_write(spark, uri: str, source: str, checkpoint: str, stream: str) -> None:
    schema = spark.read.parquet(source).schema
    query = (
        spark.readStream.schema(schema).parquet(source).writeStream.format("ledger").option("metadata", uri)
        .option("checkpointLocation", checkpoint).trigger(availableNow=True).start(stream)
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"streaming sink run failed: {query.exception()}")


def _median_add_batch(spark, uri: str, checkpoint: str, stream: str, batches: int) -> float:
    """Median addBatch (ms) of a rate -> ledger query's micro-batches, warm-up batches left out."""
    query = (
        spark.readStream.format("rate").option("rowsPerSecond", 200).load().selectExpr("value AS id")
        .writeStream.format("ledger").option("metadata", uri).option("checkpointLocation", checkpoint)
        .trigger(processingTime="200 milliseconds").start(stream)
    )

    def add_batch_ms() -> list[float]:
        return [p["durationMs"]["addBatch"] for p in query.recentProgress if "addBatch" in p["durationMs"]]

    try:
        _wait(lambda: len(add_batch_ms()) >= WARM_UP_BATCHES + batches, 600)
    finally:
        query.stop()
    return statistics.median(add_batch_ms()[WARM_UP_BATCHES:])


def _unrelated_ledgers(store: MetadataStore, count: int) -> None:
    """count closed ledgers of other jobs and queries, as a cluster's history leaves them."""
    ensemble = tuple(sorted(registry.placeable_nodes(store)))[:3]
    for i in range(count):
        tags = (("spark.job", f"other-job-{i}"), ("stream", "other")) if i % 2 else (("spark.query", "other"),)
        store.create_ledger(LedgerMetadata(
            ledger_id=0, ensemble_size=len(ensemble), write_quorum=len(ensemble), ack_quorum=2,
            fragments=(Fragment(0, ensemble),), state=LedgerState.CLOSED, custom_metadata=tags,
        ))


def _timed(fn) -> float:
    started = time.monotonic()
    fn()
    return time.monotonic() - started


def _wait(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"benchmark step did not finish within {timeout:.0f}s")
        time.sleep(0.01)


def _percentiles(values: list[float]) -> tuple[float, float]:
    """(p50, p99)"""
    if len(values) < 2:
        return values[0], values[0]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[49], cuts[98]
