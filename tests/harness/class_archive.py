"""The tests' JVM options, and a class-data archive of the classes a Spark test JVM loads.

On CI's two cores the suite is bound by CPU, and the JVMs the tests start (Spark drivers, executors and
applications of their own) spend a large share of theirs loading, verifying and linking the same thousands
of classes each time. Java's Class Data Sharing keeps them, parsed and verified, in an archive that a JVM
maps at start: `python -m tests.harness.class_archive` writes one, if this virtualenv has none, by running a
small Spark job against a real cluster (a batch write, reads, a group-by and streaming queries of the ledger
data source) in a JVM started with -XX:ArchiveClassesAtExit. scripts/test.sh runs it in the background
beside the first tests (one to four minutes, a good part of it the JVM writing the archive at its exit) and stops it
if the tests end first; every JVM a test starts after it has finished gets -XX:SharedArchiveFile
(tests/conftest.py, through JDK_JAVA_OPTIONS).

A JVM whose class path does not match the archive's (ZooKeeper, Spark's launcher) ignores it and runs as
it would without; -Xlog:cds=off keeps that out of its stderr. The archive is named after the pyspark
version and the java binary, inside the virtualenv, so a new Spark or JDK builds a new one. Only the tests
use it: the benchmarks and the demo start their JVMs as a user's would.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# Short-lived JVMs spend much of their CPU in the optimising compiler: the client compiler alone and the serial
# collector cut it by about a third (tests/spark/test_round_trip.py: 114 -> 77 CPU seconds).
BASE_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"   # a JVM that cannot use the archive says so on stderr otherwise


@functools.lru_cache(maxsize=None)
def archive_path() -> pathlib.Path:
    """Where this virtualenv keeps the archive for this pyspark and this java."""
    spark = importlib.metadata.version("pyspark")
    java = os.path.realpath(shutil.which("java") or "java")
    key = hashlib.sha256(f"{spark} {java}".encode()).hexdigest()[:12]
    return pathlib.Path(sys.prefix) / "class-archive" / f"spark-{spark}-{key}.jsa"


def java_options() -> str:
    """JDK_JAVA_OPTIONS for every JVM the tests start: the base options, and the archive once it exists."""
    archive = archive_path()
    if not archive.is_file():
        return BASE_OPTIONS
    return f"{BASE_OPTIONS} -XX:SharedArchiveFile={archive} {QUIET}"


def build(archive: pathlib.Path) -> float:
    """Run the sample job in a process of its own whose Spark JVM writes the archive at its exit; returns the
    seconds it took. A SIGTERM (scripts/test.sh stops a build the tests outran) is passed on to the job,
    which stops its cluster and session on the way out."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(f".{os.getpid()}.partial")
    started = time.monotonic()
    job = subprocess.Popen([sys.executable, "-m", "tests.harness.class_archive", "--job", str(partial)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    signal.signal(signal.SIGTERM, lambda *_: job.terminate())
    output, _ = job.communicate()
    try:
        if job.returncode != 0 or not partial.is_file():
            raise SystemExit(f"could not build the class archive (exit {job.returncode}):\n{output[-4000:]}")
        partial.replace(archive)   # whole or not at all: a JVM never maps a half-written archive
    finally:
        partial.unlink(missing_ok=True)
    return time.monotonic() - started


def sample_job(partial: pathlib.Path) -> None:
    """What the Spark tests do, in small: the classes their JVMs load on the way. Only the Spark JVM writes
    the archive (ZooKeeper's JVM starts without the option); Spark's launcher JVM writes one too, which the
    driver's, written later, replaces."""
    from pyspark.sql import SparkSession

    from connector.spark import LedgerDataSource
    from metadata.embedded import EmbeddedZooKeeper
    from metadata.store import initialise_root
    from tests.harness.node_process import NodeProcess
    from tests.spark.conftest import spark_conf

    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        zookeeper = EmbeddedZooKeeper(root / "zookeeper").start()
        nodes: list[NodeProcess] = []
        try:
            uri = zookeeper.uri("/class-archive/ledgers")
            initialise_root(uri)
            nodes = [NodeProcess(uri, root / f"node-{i}", f"node-{i}").start() for i in (1, 2, 3)]
            os.environ["JDK_JAVA_OPTIONS"] = f"{BASE_OPTIONS} -XX:ArchiveClassesAtExit={partial} {QUIET}"
            spark = spark_conf(SparkSession.builder.appName("class-archive")).getOrCreate()
            spark.sparkContext.setLogLevel("ERROR")
            try:
                _exercise(spark, LedgerDataSource, uri, root)
            finally:
                spark.stop()
        finally:
            for node in nodes:
                node.kill()
            zookeeper.stop()


def _exercise(spark, source, uri: str, root: pathlib.Path) -> None:
    from pyspark.sql import functions as F

    spark.dataSource.register(source)
    df = spark.range(2000).select(F.col("id"), F.concat(F.lit("v"), F.col("id").cast("string")).alias("value"),
                                  F.current_timestamp().alias("ts"))
    df.write.format("ledger").option("metadata", uri).mode("append").save("sample")
    read = spark.read.format("ledger").option("metadata", uri).option("includeMetadata", "true").load("sample")
    assert read.count() == 2000
    read.where(F.col("_offset") > 1000).groupBy(F.col("id") % 10).agg(F.count("*"), F.max("ts")).collect()
    df.write.parquet(str(root / "parquet"))
    spark.read.parquet(str(root / "parquet")).join(read, "id").count()
    query = (spark.readStream.format("ledger").option("metadata", uri).load("sample")
             .writeStream.format("ledger").option("metadata", uri).option("checkpointLocation", str(root / "ck"))
             .trigger(availableNow=True).start("copy"))
    query.awaitTermination(300)
    shown = (spark.readStream.format("ledger").option("metadata", uri).load("copy").writeStream
             .foreachBatch(lambda batch, _: batch.count()).trigger(availableNow=True).start())
    shown.awaitTermination(300)
    assert spark.read.format("ledger").option("metadata", uri).load("copy").count() == 2000


def main(argv: list[str]) -> None:
    if argv[:1] == ["--job"]:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # stop the cluster and the session on the way
        os.environ["JDK_JAVA_OPTIONS"] = BASE_OPTIONS
        sample_job(pathlib.Path(argv[1]))
        return
    archive = archive_path()
    if archive.is_file():
        print(f"class archive: {archive} (kept)")
        return
    print(f"class archive: {archive} built in {build(archive):.0f}s")


if __name__ == "__main__":
    main(sys.argv[1:])
