"""The Spark demo: write a stream with Spark, crash a writer, read everything back with Spark.

`python -m connector.demo [--dir DIR] [--rows N] [--dangling-rows M]` starts the embedded
cluster (ZooKeeper and three storage nodes), writes N generated rows to stream "events" with Spark,
leaves one ledger dangling as a crashed writer would (a process that appends M rows and is then
SIGKILLed), reads the stream back with Spark (which recovers the dangling ledger), prints a per-ledger
summary and checks that every row came back exactly once, then stops everything.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

from connector.client import LedgerClient
from connector.cluster import LocalCluster
from connector.demo.sample import sample_dataframe
from connector.demo.session import local_session
from metadata import registry

STREAM = "events"
SPARK_CONF = {"spark.ui.showConsoleProgress": "false", "spark.sql.python.filterPushdown.enabled": "true",
              "spark.driver.memory": "2g"}


def crash_a_writer(uri: str, rows: int) -> int:
    """Run a stream writer that appends rows and is SIGKILLed; returns its (now dangling) ledger id."""
    writer = subprocess.Popen(
        [sys.executable, "-m", "connector.demo.dangling", "--metadata", uri, "--stream", STREAM, "--rows", str(rows)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        words = writer.stdout.readline().split()
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
    if not words or words[0] != "acknowledged":
        raise SystemExit("the crashing writer failed before its appends were acknowledged")
    ledger_id, entries = int(words[1]), int(words[3])
    print(f"crashed writer: appended {rows:,} rows in {entries} entries to ledger {ledger_id}, all acknowledged, "
          "then SIGKILL: the ledger is OPEN on the stream and nobody will close it")
    return ledger_id


def wait_until_dangling(uri: str, ledger_id: int, timeout: float = 60.0) -> None:
    """A killed writer counts as gone once ZooKeeper expires its session."""
    with LedgerClient(uri) as lc:
        writer_id = lc.ledger_metadata(ledger_id).writer_id
        deadline = time.monotonic() + timeout
        while registry.writer_alive(lc.store, writer_id):
            if time.monotonic() > deadline:
                raise SystemExit(f"the killed writer's session did not expire within {timeout:.0f}s")
            time.sleep(0.2)
    print(f"ZooKeeper expired the crashed writer's session: ledger {ledger_id} is dangling")


def run(directory: str, rows: int, dangling_rows: int) -> int:
    from pyspark.sql import functions as F

    print(f"starting ZooKeeper and 3 storage nodes in {directory} ...")
    with LocalCluster(directory, nodes=3) as cluster:
        uri = cluster.metadata_uri
        print(f"metadata: {uri}")
        spark = local_session("ledger-demo", **SPARK_CONF)
        try:
            started = time.monotonic()
            sample_dataframe(spark, rows).write.format("ledger").mode("append").option("metadata", uri).save(STREAM)
            print(f"Spark wrote {rows:,} rows to stream {STREAM!r} in {time.monotonic() - started:.1f}s "
                  "(one ledger per task, E=3 WQ=3 AQ=2, committed in one CAS)")

            dangling = crash_a_writer(uri, dangling_rows)
            wait_until_dangling(uri, dangling)

            started = time.monotonic()
            df = spark.read.format("ledger").option("metadata", uri).option("includeMetadata", "true").load(STREAM)
            per_ledger = (
                df.groupBy("_ledger_id")
                .agg(F.count("*").alias("rows"), F.countDistinct("_entry_id").alias("entries"),
                     F.min("_offset").alias("first_offset"), F.max("_offset").alias("last_offset"),
                     F.sum(F.when(F.col("_offset") != F.col("id"), 1).otherwise(0)).alias("misplaced"))
                .orderBy("first_offset").collect()
            )
            took = time.monotonic() - started
            view = {r.ledger_id: r for r in spark.read.format("ledger").option("metadata", uri)
                    .option("view", "ledgers").load(STREAM).collect()}
            print(f"Spark read the stream back in {took:.1f}s (recovering ledger {dangling} first):")
            print(f"  {'ledger':>8} {'state':>7} {'rows':>9} {'entries':>7} {'offsets':>21}  ensemble")
            for r in per_ledger:
                meta = view[r._ledger_id]
                ensemble = ",".join(meta.fragments[-1].ensemble)
                mark = "  <- was dangling, recovered" if r._ledger_id == dangling else ""
                print(f"  {r._ledger_id:>8} {meta.state:>7} {r.rows:>9,} {r.entries:>7} "
                      f"{r.first_offset:>10}..{r.last_offset:<10} {ensemble}{mark}")
            total = sum(r.rows for r in per_ledger)
            distinct = df.select("id").distinct().count()
            expected = rows + dangling_rows
            ok = (total == distinct == expected and all(r.misplaced == 0 for r in per_ledger)
                  and view[dangling].state == "CLOSED")
            print(f"check: {total:,} rows read, {distinct:,} distinct ids, expected {expected:,} "
                  f"(ids 0..{expected - 1}, each at its own offset): {'every row came back' if ok else 'MISMATCH'}")
        finally:
            spark.stop()
    print("stopped Spark and the cluster")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m connector.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="cluster directory (default: a temporary directory)")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dangling-rows", type=int, default=20_000)
    args = parser.parse_args(argv)
    if args.dir:
        return run(args.dir, args.rows, args.dangling_rows)
    with tempfile.TemporaryDirectory(prefix="ledger-spark-demo-") as directory:
        return run(directory, args.rows, args.dangling_rows)


if __name__ == "__main__":
    sys.exit(main())
