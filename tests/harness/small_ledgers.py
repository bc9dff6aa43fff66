"""Streams of many small arrow ledgers, as a streaming sink leaves them: written by the code a Spark write task
runs (write_task_ledger) and committed by the driver's code (a batch job's or a sink micro-batch's commit), all
without a SparkSession. Row ids count up without gaps, so a reader can tell a lost row from a duplicate."""
from __future__ import annotations

import concurrent.futures
import json
import pathlib
import queue
import threading
import uuid

import pyarrow as pa
from pyspark.sql.types import LongType, StructField, StructType

from connector.bench.task_context import StandInTask
from connector.spark.jobs import job_registry, query_registry
from connector.spark.options import LedgerOptions
from connector.spark.recovery import ATTEMPT_TAG, PARTITION_TAG, STREAM_TAG, TASK_TAG
from connector.spark.stream_options import StreamOptions
from connector.spark.stream_write import BATCH_TAG, QUERY_TAG, LedgerStreamWriter
from connector.spark.write import LedgerWriter, write_task_ledger

SCHEMA = StructType([StructField("id", LongType())])


def ledger_rows(ledger_ids: range, first_id: int, per_ledger: int | None = None) -> list[pa.RecordBatch]:
    """The rows of consecutive small ledgers: 1 + n % 5 rows for ledger n (or per_ledger each), ids from
    first_id on."""
    batches = []
    for n in ledger_ids:
        rows = per_ledger or 1 + n % 5
        batches.append(pa.record_batch([pa.array(range(first_id, first_id + rows), pa.int64())], names=["id"]))
        first_id += rows
    return batches


def rows_in(ledgers: int, per_ledger: int | None = None) -> int:
    return sum(per_ledger or 1 + n % 5 for n in range(ledgers))


def options(uri: str, stream: str) -> LedgerOptions:
    return LedgerOptions.parse({"metadata": uri, "path": stream, "ensembleSize": "2", "writeQuorum": "2",
                                "ackQuorum": "2"})


def write_jobs(uri: str, stream: str, ledgers: range, per_job: int = 50, per_ledger: int | None = None) -> None:
    """Ledgers `ledgers` (numbered as in the whole stream) committed by batch write jobs of per_job tasks; the
    rows of each task are one record batch (ledger_rows)."""
    opts = options(uri, stream)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for start in range(ledgers.start, ledgers.stop, per_job):
            numbers = range(start, min(ledgers.stop, start + per_job))
            batches = ledger_rows(numbers, rows_in(start, per_ledger), per_ledger)
            writer = LedgerWriter.prepare(opts, SCHEMA, overwrite=False)

            def task(partition: int, writer=writer, batches=batches):
                ctx = StandInTask(partition)
                return write_task_ledger(opts, writer.schema, iter([batches[partition]]), ctx, writer._tags(ctx),
                                         job_registry(writer.job_id))

            writer.commit(list(pool.map(task, range(len(batches)))))


class SinkQuery:
    """A streaming query's sink: each micro-batch's task ledgers written and committed as Spark runs them."""

    def __init__(self, uri: str, stream: str, checkpoint: pathlib.Path):
        checkpoint.mkdir(parents=True, exist_ok=True)
        (checkpoint / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))
        self.opts = options(uri, stream)
        self.stream_options = StreamOptions(checkpoint_location=str(checkpoint))
        self.batch_id = 0

    def commit(self, ledgers: range) -> None:
        """One micro-batch of one task ledger per stream ledger number in `ledgers`."""
        writer = LedgerStreamWriter.prepare(self.opts, self.stream_options, SCHEMA)
        batches = ledger_rows(ledgers, rows_in(ledgers.start))
        messages = []
        for partition, batch in enumerate(batches):
            ctx = StandInTask(partition)
            tags = {STREAM_TAG: self.opts.stream, QUERY_TAG: writer.query_id, BATCH_TAG: self.batch_id,
                    PARTITION_TAG: partition, ATTEMPT_TAG: 0, TASK_TAG: partition}
            messages.append(write_task_ledger(self.opts, writer.schema, iter([batch]), ctx, tags,
                                              query_registry(writer.query_id, self.batch_id)))
        writer.commit(messages, self.batch_id)
        self.batch_id += 1


def tailing_query(spark, uri: str, stream: str, name: str):
    """A streaming query reading the stream 25 rows per micro-batch into the memory table `name`."""
    return (spark.readStream.format("ledger").option("metadata", uri).option("maxRecordsPerTrigger", "25")
            .load(stream).writeStream.format("memory").queryName(name)
            .trigger(processingTime="100 milliseconds").start())


class CommitRounds:
    """Commits landing while a test works on the stream: in a thread, `rounds` rounds of 20 ledgers by two batch
    jobs and then 10 by a sink micro-batch, after the `first` ledgers already written. next() waits for the
    next round and answers the ledgers written so far, None after the last round."""

    def __init__(self, uri: str, stream: str, checkpoint: pathlib.Path, first: int, rounds: int):
        self.uri, self.stream, self.first, self.rounds = uri, stream, first, rounds
        self.sink = SinkQuery(uri, stream, checkpoint)
        self.done: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._commit, daemon=True)

    def _commit(self) -> None:
        written = self.first
        try:
            for _ in range(self.rounds):
                write_jobs(self.uri, self.stream, range(written, written + 20), per_job=10)
                self.sink.commit(range(written + 20, written + 30))
                written += 30
                self.done.put(written)
        finally:
            self.done.put(None)

    def start(self) -> "CommitRounds":
        self.thread.start()
        return self

    def next(self, timeout: float = 300) -> int | None:
        return self.done.get(timeout=timeout)

    def join(self) -> None:
        self.thread.join(timeout=300)
        assert not self.thread.is_alive(), "the commit rounds did not finish"
