"""`ledger bench spark`: Spark writing and reading a ledger stream beside parquet on local disk, one run.

Starts ZooKeeper and three storage nodes (fsync on) and a local Spark session, caches the sample
DataFrame (id long, ts timestamp, key string ~16 B, value binary ~200 B), then times, on that same
cached DataFrame: a ledger write (E=3, WQ=3, AQ=2) against df.write.parquet to local disk, and
reading both back (a count, and a group-by that touches id, ts and value). Every case runs --runs
times, in rounds (timed_rounds), and the fastest run counts: the first run of a ledger case also
starts Spark's Python workers (and imports pyarrow, grpc and kazoo in them), which parquet, read by
the JVM alone, never pays, and runs on a shared 2-core machine vary by 15% or more. Ratios are the
ledger path's throughput over parquet's (1.0 = as fast as parquet). The cpu lines split each case's fastest
run's CPU between Spark's JVM, its Python workers, the storage nodes and ZooKeeper (connector/bench/cpu.py), and
say how many cores that kept busy: where a run kept them busy, its time against the ceiling's is a matter of CPU,
and these say whose.

The replicated ceiling (connector/bench/replicated_ceiling.py) writes the same DataFrame as the ledger's entries to
three node ceiling servers, acknowledged by two, without digests, metadata or a storage node's own work: the least a
replicated store of these rows costs here. Where it reaches less than 0.7 of the ceiling, so can no ledger write,
and the write target is printed as bound. Its servers' CPU counts as nodes' in the cpu lines.

Both sides compress as they would by default in use: parquet with Spark's default codec (snappy),
the ledger stream with --compression (default lz4, the connector's fast codec); --compression none
measures uncompressed entries.

Small ledgers (--small-ledgers, 0 to skip): a stream of that many ledgers of --small-rows rows, one per write
task, as a streaming sink leaves them, counted with small ledgers packed into shared partitions (the default
maxPartitionBytes) against one partition per ledger (maxPartitionBytes=0, how every read was planned before
packing), in rounds, best of --runs.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

from connector.bench.cpu import CpuSplit, SparkCpu
from connector.commands.arguments import directory, entry_bytes, non_negative, positive

TARGETS = {"write": 0.4, "read": 0.6}


def add_arguments(parser) -> None:
    parser.add_argument("--rows", type=positive, default=2_000_000)
    parser.add_argument("--dir", type=directory, default=None,
                        help="where the cluster and the parquet copy live (default: temp)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=positive, default=None, help="write tasks (default: Spark's parallelism)")
    parser.add_argument("--entry-bytes", type=entry_bytes, default=1024 * 1024)
    parser.add_argument("--compression", default="lz4", choices=("none", "lz4", "zstd"),
                        help="the ledger stream's compression (parquet keeps Spark's default, snappy)")
    parser.add_argument("--runs", type=positive, default=3, help="runs of every case; the fastest counts")
    parser.add_argument("--small-ledgers", type=non_negative, default=300,
                        help="ledgers of the small-ledgers stream, one per write task (0: skip that case)")
    parser.add_argument("--small-rows", type=positive, default=100,
                        help="rows in each ledger of the small-ledgers stream")


def run(args) -> int:
    if args.dir:
        return _run(pathlib.Path(args.dir), args)
    with tempfile.TemporaryDirectory(prefix="ledger-bench-spark-") as directory:
        return _run(pathlib.Path(directory), args)


def bench_session(master: str, app_name: str):
    """The benchmark's local SparkSession (the cold ceiling's too), with the ceiling source registered."""
    from pyspark.sql import SparkSession

    from connector.bench.ceiling import CeilingDataSource
    from connector.bench.replicated_ceiling import ReplicatedCeilingDataSource

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(master).appName(app_name)
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "3g")
        .config("spark.sql.session.timeZone", "UTC").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(CeilingDataSource)
    spark.dataSource.register(ReplicatedCeilingDataSource)
    return spark


def grouped(frame) -> None:
    """The group-by case: touches id, ts and the bulky value column."""
    from pyspark.sql import functions as F

    frame.groupBy(F.col("id") % 1000).agg(F.count("*"), F.sum(F.length("value")), F.max("ts")).collect()


def ceiling_write(df):
    from connector.bench.ceiling import CeilingDataSource

    return lambda: df.write.format(CeilingDataSource.name()).mode("append").save()


def replicated_ceiling_write(df, servers: list, args):
    """The write to the replicated ceiling (connector/bench/replicated_ceiling.py): the same entries as the ledger
    write's, to every server of the node ceiling's, acknowledged by two of three."""
    from connector.bench.replicated_ceiling import ReplicatedCeilingDataSource

    return lambda: (df.write.format(ReplicatedCeilingDataSource.name()).mode("append")
                    .option("servers", ",".join(server.address for server in servers)).option("ackQuorum", 2)
                    .option("entryBytes", args.entry_bytes).option("compression", args.compression).save())


def ceiling_read(spark, rows: int, partitions: int, batch_bytes: int):
    from connector.bench.ceiling import CeilingDataSource

    return lambda: (spark.read.format(CeilingDataSource.name()).option("rows", rows).option("partitions", partitions)
                    .option("batchBytes", batch_bytes).load())


def _cold_ceiling(args, directory: pathlib.Path) -> dict[str, tuple[float, float]]:
    """The ceiling's cases in a Spark application of their own (connector/bench/cold_ceiling.py): how much of a
    first run any Python Data Source pays in a new application, measured in this run."""
    done = subprocess.run(
        [sys.executable, "-m", "connector.bench.cold_ceiling", "--rows", str(args.rows), "--master", args.master,
         "--entry-bytes", str(args.entry_bytes), "--runs", str(max(1, args.runs)), "--dir", str(directory / "cold"),
         *(["--partitions", str(args.partitions)] if args.partitions else [])],
        capture_output=True, text=True, timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the cold ceiling run failed:\n{done.stderr[-3000:]}")
    return {case: tuple(took) for case, took in json.loads(done.stdout.strip().splitlines()[-1]).items()}


class Timed(NamedTuple):
    """A case's fastest and first run (seconds) and, when measured, the CPU of its fastest run."""

    best: float
    first: float
    best_cpu: CpuSplit | None = None


def timed_rounds(cases: dict, runs: int, cpu: SparkCpu | None = None) -> dict[object, Timed]:
    """The fastest and first wall time of each case over `runs` rounds, each round running every case once in order,
    and with `cpu` the CPU of each case's fastest run.

    Rounds, not each case's runs back to back: a case's second and third runs right after its first still ran
    cold in the JVM (ledger count 3.25, 1.23, 1.07 s, then 0.97, 0.90, 0.79 s once the ceiling's three counts had
    run in between), so a source measured later in the application had warmer best runs than one measured
    earlier. In rounds every source's later runs are equally warm, and each first run is still the first use of
    that source for that case in the application."""
    took: dict = {case: [] for case in cases}
    for _ in range(runs):
        for case, fn in cases.items():
            before = cpu.read() if cpu is not None else None
            started = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - started
            took[case].append((elapsed, cpu.read() - before if cpu is not None else None))
    timed = {}
    for case, runs_of_case in took.items():
        fastest, fastest_cpu = min(runs_of_case, key=lambda run: run[0])
        timed[case] = Timed(fastest, runs_of_case[0][0], fastest_cpu)
    return timed


def _run(directory: pathlib.Path, args) -> int:
    from connector.cluster import LocalCluster
    from connector.demo.sample import sample_dataframe
    from connector.spark.datasource import LedgerDataSource

    from connector.bench.node_ceiling import CeilingServer

    with LocalCluster(directory / "cluster", nodes=3) as cluster, contextlib.ExitStack() as stack:
        uri = cluster.metadata_uri
        servers = []
        for n in range(3):   # each stopped however the run ends, also if a later one fails to start
            servers.append(CeilingServer(directory / "replicated-ceiling" / str(n)))
            stack.callback(servers[-1].stop)
        spark = bench_session(args.master, "ledger-bench-spark")
        spark.dataSource.register(LedgerDataSource)
        try:
            df = sample_dataframe(spark, args.rows, partitions=args.partitions).cache()
            df.count()
            parquet = str(directory / "parquet")

            def ledger_reader():
                return spark.read.format("ledger").option("metadata", uri).load("bench")

            ceiling_reader = ceiling_read(spark, args.rows, df.rdd.getNumPartitions(), args.entry_bytes)
            times = timed_rounds({
                ("write", "parquet"): lambda: df.write.mode("overwrite").parquet(parquet),
                ("write", "ledger"): lambda: (
                    df.write.format("ledger").mode("overwrite").option("metadata", uri)
                    .option("ensembleSize", 3).option("writeQuorum", 3).option("ackQuorum", 2)
                    .option("entryBytes", args.entry_bytes).option("compression", args.compression).save("bench")),
                ("write", "ceiling"): ceiling_write(df),
                ("write", "replicated ceiling"): replicated_ceiling_write(df, servers, args),
                ("count", "parquet"): lambda: spark.read.parquet(parquet).count(),
                ("count", "ledger"): lambda: ledger_reader().count(),
                ("count", "ceiling"): lambda: ceiling_reader().count(),
                ("group-by", "parquet"): lambda: grouped(spark.read.parquet(parquet)),
                ("group-by", "ledger"): lambda: grouped(ledger_reader()),
                ("group-by", "ceiling"): lambda: grouped(ceiling_reader()),
            }, max(1, args.runs),
               SparkCpu.of(spark, [node.pid for node in cluster.state.nodes] + [s.pid for s in servers],
                           cluster.state.zk_pid))
            assert ledger_reader().count() == args.rows, "the ledger stream does not hold every row"
            small = _small_ledgers(spark, uri, args) if args.small_ledgers > 0 else None
        finally:
            spark.stop()
        cold_ceiling = _cold_ceiling(args, directory)  # beside the same (idle) nodes and ZooKeeper as the ledger's
    mb = args.rows * (8 + 8 + 16 + 192) / 1e6
    print(f"{args.rows:,} rows (~{mb:.0f} MB of column data), {args.master}, 3 storage nodes with fsync, "
          f"E=3 WQ=3 AQ=2, entryBytes={args.entry_bytes}, compression={args.compression} "
          f"(parquet: snappy), best of {max(1, args.runs)} runs")
    ok = True
    for case in ("write", "count", "group-by"):
        ledger, ledger_first = times[(case, "ledger")].best, times[(case, "ledger")].first
        base, base_first = times[(case, "parquet")].best, times[(case, "parquet")].first
        ratio = base / ledger
        target = TARGETS["write" if case == "write" else "read"]
        ok &= ratio >= target
        print(f"  {case:<9} ledger {ledger:6.2f}s (first run {ledger_first:6.2f}s, {args.rows / ledger:>9,.0f} rows/s)"
              f"   parquet {base:6.2f}s (first {base_first:6.2f}s)   ledger/parquet throughput {ratio:.2f}x "
              f"(target >= {target}x){'' if ratio >= target else '  BELOW TARGET'}")
    ceiling = {case: times[(case, "ceiling")].best for case in ("write", "count", "group-by")}
    print("  ceiling   a minimal Arrow Python Data Source that only counts the rows it is given, and yields the "
          "same rows from memory (connector/bench/ceiling.py), the most any Python Data Source reaches here: "
          + ", ".join(f"{case} {took:.2f}s = {times[(case, 'parquet')].best / took:.2f}x parquet"
                      for case, took in ceiling.items()))
    _print_issue_targets(times, cold_ceiling)
    _print_cpu(times)
    if small is not None:
        print(small)
    return 0 if ok else 1


def _small_ledgers(spark, uri: str, args) -> str:
    """The small-ledgers case (see the module's docstring): its figure line."""
    from pyspark.sql import functions as F

    ledgers, rows = args.small_ledgers, args.small_ledgers * args.small_rows
    df = spark.range(0, rows, numPartitions=ledgers).select("id", F.format_string("row %010d", "id").alias("s"))
    started = time.perf_counter()
    df.write.format("ledger").mode("append").option("metadata", uri).save("small")
    written = time.perf_counter() - started

    def reader(max_partition_bytes: int | None):
        read = spark.read.format("ledger").option("metadata", uri)
        if max_partition_bytes is not None:
            read = read.option("maxPartitionBytes", max_partition_bytes)
        return read.load("small")

    def count(max_partition_bytes: int | None) -> None:
        assert reader(max_partition_bytes).count() == rows, "the small-ledgers stream does not hold every row"

    times = timed_rounds({"packed": lambda: count(None), "single": lambda: count(0)}, max(1, args.runs))
    packed, single = times["packed"].best, times["single"].best
    return (f"  small ledgers: a count of {ledgers:,} ledgers of {args.small_rows:,} rows (written in {written:.1f}s, "
            f"one per task, as a streaming sink leaves them): packed into {reader(None).rdd.getNumPartitions():,} "
            f"partitions {packed:.2f}s, one partition per ledger {single:.2f}s; {single / packed:.1f}x faster")


COLD_TARGETS = {"parquet": 2.0, "best": 1.5}   # first run <= 2x parquet's first run; <= 1.5x the best run
CEILING_TARGETS = {"write": 0.7, "count": 0.8, "group-by": 0.8}   # ceiling time / ledger time


def _print_issue_targets(times: dict, cold_ceiling: dict[str, tuple[float, float]]) -> None:
    """The cold-query and ceiling ratios, each against its target, and the cold bound the ceiling sets."""
    def mark(met: bool) -> str:
        return "" if met else " MISSED"

    cold = []
    limit = COLD_TARGETS["parquet"]
    for case in ("write", "group-by"):
        ratio = times[(case, "ledger")].first / times[(case, "parquet")].first
        cold.append(f"{case} {ratio:.2f}x parquet's first run (<= {limit:g}){mark(ratio <= limit)}")
    for case in ("write", "count", "group-by"):
        ratio = times[(case, "ledger")].first / times[(case, "ledger")].best
        cold.append(f"{case} first/best {ratio:.2f} (<= {COLD_TARGETS['best']:g}){mark(ratio <= COLD_TARGETS['best'])}")
    print("  cold      " + "; ".join(cold))
    bound = []
    for case in ("write", "count", "group-by"):
        best, first = cold_ceiling[case]
        bound.append(f"{case} first {first:.2f}s, best {best:.2f}s, first/best {first / best:.2f}"
                     + (f", {first / times[(case, 'parquet')].first:.2f}x parquet's first run"
                        if case != "count" else ""))
    print("  cold ceiling, the same cases in an application of its own (the bound for a first run): "
          + "; ".join(bound))
    ceiling = []
    for case, target in CEILING_TARGETS.items():
        ratio = times[(case, "ceiling")].best / times[(case, "ledger")].best
        bound = ""
        if case == "write" and ratio < target:
            replicated = times[(case, "ceiling")].best / times[(case, "replicated ceiling")].best
            bound = (f", bound on this machine: the replicated ceiling reaches {replicated:.2f}" if replicated < target
                     else f"; the replicated ceiling reaches {replicated:.2f}")
        ceiling.append(f"{case} {ratio:.2f} (>= {target:g}){mark(ratio >= target)}{bound}")
    print("  vs ceiling (ceiling time / ledger time) " + "; ".join(ceiling))
    replicated = times[("write", "replicated ceiling")].best
    print(f"  replicated ceiling: the ledger write's entries sent to three node ceiling servers, acknowledged by two "
          f"(connector/bench/replicated_ceiling.py): write {replicated:.2f}s; ledger time / it "
          f"{times[('write', 'ledger')].best / replicated:.2f}")


def _print_cpu(times: dict) -> None:
    """Each case's fastest runs: their CPU by process kind, and how many cores that kept busy over the run."""
    for case in ("write", "count", "group-by"):
        print(f"  cpu {case:<9} " + "; ".join(
            f"{source} {timed.best:.2f}s: {timed.best_cpu.describe(timed.best)}"
            for source in ("ledger", "ceiling", "replicated ceiling", "parquet")
            if (timed := times.get((case, source))) is not None and timed.best_cpu is not None))
