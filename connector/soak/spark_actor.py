"""The Spark part of `ledger soak --spark`: the actor that drives Spark, and what the checker reads back.

The actor (workload role `spark`) is one process with one small SparkSession (local[2,4], no UI) that runs

- a streaming query: Spark's `rate` source (ROWS_PER_SECOND rows a second, one partition) -> the ledger
  sink on the stream SPARK_STREAM, checkpoint in --checkpoint, a trigger every TRIGGER. Its rows are
  (value, source="rate"); the rate source numbers them 0, 1, 2, ... from the query's first start, and a
  query restarted on the same checkpoint goes on from its last planned batch, so exactly-once output is
  exactly the values 0..end-1 of the batches the sink committed;
- a batch writer: every BATCH_EVERY seconds (the first FIRST_BATCH seconds after the start)
  df.write.format("ledger").mode("append") of BATCH_ROWS rows (value 0..n-1) into the same stream, its
  source column a tag naming the write and its row count (batch_tag), so the checker can judge a write
  whose outcome the history lacks (its actor was killed).

Both commit to the same stream, so the sink's and the batch jobs' compare-and-sets meet. History records:
query-start (run: first, restart or drain), query-end (the query died, or was stopped), spark-batch (ok,
failed: refused before its job started, or unknown). The status file names the batch write in flight: the
nemesis kills the driver only between batch writes (see nemesis.py). SIGTERM ends the actor: the batch
write in flight finishes, the query stops, and a last run of it with Trigger.AvailableNow on the same
checkpoint commits (or, a replay, discards) the micro-batch the stop interrupted, so that its task ledgers
are swept: nothing is left in the query's registry.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import re
import time
from typing import TYPE_CHECKING, Iterator

from connector.soak.history import FAILED, OK, UNKNOWN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from connector.soak.workload import Actor

SPARK_STREAM = "soak-spark"
RATE = "rate"                    # the source column of the streaming query's rows
ROWS_PER_SECOND = 100
TRIGGER = "2 seconds"
BATCH_EVERY = (20.0, 40.0)
FIRST_BATCH = (5.0, 15.0)        # after the session is up: a short soak gets its batch write too
BATCH_ROWS = (2000, 5000)
DRAIN_SECONDS = 60.0             # the last AvailableNow run at the end
QUERY_RETRY_SECONDS = 2.0
SCHEMA = "value long, source string"
# A batch write refused by the driver's prepare(), before its job started: nothing was written.
REFUSED_BEFORE_JOB = ("writable storage nodes are registered",)


def batch_tag(actor: str, number: int, rows: int) -> str:
    """The source column of a batch write's rows: who wrote it, its number and its row count."""
    return f"{actor}/{number}/{rows}"


def tag_rows(tag: str) -> int | None:
    """The row count a batch tag promises, or None if it is not a tag the soak wrote."""
    match = re.fullmatch(r"[^/]+/\d+/(\d+)", tag)
    return int(match.group(1)) if match else None


def session(app_name: str) -> "SparkSession":
    """A small local session: two cores at most, no UI, two shuffle partitions (connector/spark/session.py);
    a failed task is tried up to 4 times, as spark.task.maxFailures does on a cluster (local mode tries once)."""
    from connector.demo.session import local_session

    return local_session(app_name, "local[2,4]", **{"spark.driver.memory": "1g", "spark.ui.showConsoleProgress": "false"})


# -- the actor -----------------------------------------------------------------------------------------------


class SparkActor:
    def __init__(self, actor: "Actor", spark: "SparkSession"):
        self.actor = actor
        self.spark = spark
        self.args = actor.args
        self.query = None
        self.starts = 0
        self.batch_number = 0
        self.progressed = False   # a query of this driver committed a micro-batch (published: see publish)

    def run(self) -> None:
        next_batch = time.monotonic() + self.actor.rng.uniform(*FIRST_BATCH)
        self.publish()
        while not self.actor.stopping():
            if self.query is None or not self.query.isActive:
                self._ended()
                self._start("first" if self.starts == 0 and self.actor.name.endswith(".1") else "restart")
            elif not self.progressed and self._committed_a_batch():
                self.progressed = True
                self.publish()
            if time.monotonic() >= next_batch:
                self._batch_write()
                next_batch = time.monotonic() + self.actor.rng.uniform(*BATCH_EVERY)
            self.actor.pause(0.5)
        self.finish()

    def _committed_a_batch(self) -> bool:
        """A micro-batch ran through the sink (Spark reports a trigger that found no data too, as a fresh rate
        source's first one is: that progress has no addBatch)."""
        return any("addBatch" in progress.durationMs for progress in self.query.recentProgress)

    def publish(self, batch: str | None = None) -> None:
        """The status file: the nemesis reads `batch` (the write in flight) with the actor stopped, and kills a
        driver only once it `progressed` (else a driver killed before each first batch would commit nothing)."""
        query = self.query.id if self.query is not None else None
        self.actor.write_status({"actor": self.actor.name, "pid": os.getpid(), "role": "spark", "batch": batch,
                                 "query": query, "progressed": self.progressed})

    def _start(self, run: str, **trigger) -> bool:
        from pyspark.errors import PySparkException
        from pyspark.sql import functions as F

        t = time.time()
        try:
            rate = (self.spark.readStream.format("rate").option("rowsPerSecond", ROWS_PER_SECOND)
                    .option("numPartitions", 1).load())
            self.query = (rate.select("value", F.lit(RATE).alias("source")).writeStream.format("ledger")
                          .option("metadata", self.args.metadata)
                          .option("checkpointLocation", self.args.checkpoint)
                          .trigger(**(trigger or {"processingTime": TRIGGER})).start(self.args.spark_stream))
        except PySparkException as exc:
            self.actor.history.record("query-start", FAILED, t, run=run, error=spark_error(exc))
            self.query = None
            self.actor.pause(QUERY_RETRY_SECONDS)
            return False
        self.starts += 1
        self.actor.history.record("query-start", OK, t, run=run, query=self.query.id)
        self.publish()
        return True

    def _ended(self) -> None:
        """A query that is no longer active died: record why (its batch in flight may or may not have landed)."""
        if self.query is None:
            return
        error = self.query.exception()
        self.actor.history.record("query-end", UNKNOWN, time.time(), query=self.query.id,
                                  error=spark_error(error) if error is not None else "ended")
        self.query = None
        self.actor.pause(QUERY_RETRY_SECONDS)

    def _batch_write(self) -> None:
        from pyspark.errors import PySparkException
        from pyspark.sql import functions as F
        from py4j.protocol import Py4JJavaError

        rows = self.actor.rng.randint(*BATCH_ROWS)
        tag = batch_tag(self.actor.name, self.batch_number, rows)
        self.batch_number += 1
        self.publish(batch=tag)
        t = time.time()
        try:
            df = self.spark.range(0, rows, numPartitions=2).select(F.col("id").alias("value"),
                                                                   F.lit(tag).alias("source"))
            df.write.format("ledger").option("metadata", self.args.metadata).mode("append") \
                .save(self.args.spark_stream)
        except (PySparkException, Py4JJavaError) as exc:
            error = spark_error(exc)
            outcome = FAILED if any(s in str(exc) for s in REFUSED_BEFORE_JOB) else UNKNOWN
            self.actor.history.record("spark-batch", outcome, t, tag=tag, rows=rows, error=error)
        else:
            self.actor.history.record("spark-batch", OK, t, tag=tag, rows=rows)
        finally:
            self.publish()

    def finish(self) -> None:
        """Stop the query, then run it once more with AvailableNow so that the micro-batch the stop
        interrupted is committed or discarded and its task ledgers swept (bounded by DRAIN_SECONDS)."""
        if self.query is not None and self.query.isActive:
            t = time.time()
            self.query.stop()
            self.actor.history.record("query-end", OK, t, query=self.query.id, error="stopped")
        else:
            self._ended()
        if not self._start("drain", availableNow=True):
            return
        t = time.time()
        if self.query.awaitTermination(DRAIN_SECONDS) and self.query.exception() is None:
            self.actor.history.record("query-end", OK, t, query=self.query.id, error="drained")
            return
        error = self.query.exception()
        self.query.stop()
        self.actor.history.record("query-end", UNKNOWN, t, query=self.query.id,
                                  error=spark_error(error) if error else f"not drained in {DRAIN_SECONDS:.0f}s")


def run_spark(actor: "Actor") -> None:
    """The workload role `spark`: one SparkSession for the life of the process."""
    spark = session(f"ledger-soak-{actor.name}")
    try:
        SparkActor(actor, spark).run()
    finally:
        spark.stop()


def spark_error(exc: BaseException) -> str:
    """The line of a Spark error that names its cause (the last `SomethingError: ...`), not its traces."""
    text = str(exc)
    causes = re.findall(r"^\s*(?:[\w.]+\.)?(\w+(?:Error|Exception): .+)$", text, flags=re.MULTILINE)
    if causes:
        return causes[-1][:300]
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(exc).__name__}: {first}"[:300]


# -- what the checker reads ----------------------------------------------------------------------------------


@dataclasses.dataclass
class SparkOutput:
    """What the Spark actor's stream holds at the end, and how far its streaming query committed.

    rows: the stream's rows (value, source). committed_end: the rate values the sink's commit record
    accounts for, 0..committed_end-1 (the end of the query's last batch the stream holds, from the
    checkpoint's offsets). spark_committed_end: the same for the last batch in Spark's own commit log,
    which may lag the sink (killed between the two) but never lead it."""

    rows: "DataFrame"
    committed_end: int
    spark_committed_end: int


def read_output(spark: "SparkSession", store, metadata_uri: str, stream: str, checkpoint: pathlib.Path,
                rows_per_second: int = ROWS_PER_SECOND) -> SparkOutput:
    """Read the stream once (spark.read.format("ledger")) and the checkpoint; the rows are materialized, so
    the checks that follow do not read the store again."""
    from metadata.query_commits import read_query_commit
    from metadata.streams import find_stream

    found = find_stream(store, stream)
    if found is None:
        rows = spark.createDataFrame([], SCHEMA)
        committed = None
    else:
        rows = spark.read.format("ledger").option("metadata", metadata_uri).load(stream).select("value", "source")
        rows = rows.localCheckpoint(eager=True)
        query_id = checkpoint_query_id(checkpoint)
        committed = read_query_commit(store, found.value, f"query-{query_id}").last_batch if query_id else None
    return SparkOutput(rows, rate_end(checkpoint, committed, rows_per_second),
                       rate_end(checkpoint, last_batch(checkpoint / "commits"), rows_per_second))


def checkpoint_query_id(checkpoint: pathlib.Path) -> str | None:
    try:
        return json.loads((checkpoint / "metadata").read_text())["id"]
    except (OSError, ValueError, KeyError):
        return None


def last_batch(log_dir: pathlib.Path) -> int | None:
    """The newest batch id of a checkpoint log (offsets/ or commits/: one file per batch, named by its id)."""
    try:
        ids = [int(p.name) for p in log_dir.iterdir() if p.name.isdigit()]
    except OSError:
        return None
    return max(ids) if ids else None


def rate_end(checkpoint: pathlib.Path, batch: int | None, rows_per_second: int) -> int:
    """The rate value a micro-batch ends before: its end offset (seconds since the query's first start, the
    third line of offsets/BATCH) times the rows per second (no ramp-up). 0 before any batch."""
    if batch is None:
        return 0
    lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    return int(lines[2]) * rows_per_second


@contextlib.contextmanager
def checker_session() -> Iterator["SparkSession"]:
    spark = session("ledger-soak-checker")
    try:
        yield spark
    finally:
        spark.stop()
