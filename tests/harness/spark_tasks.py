"""Spark write tasks and commits without a SparkSession: the executor side of the ledger writers
(LedgerWriter.write, LedgerStreamWriter.write) runs in the test process with a stand-in TaskContext, and
the driver side (prepare, commit, abort) is called as Spark calls it."""
from __future__ import annotations

import json
import threading
from typing import Iterable

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.types import LongType, StructField, StructType

from connector.bench.task_context import StandInTask as Task
from connector.client import LedgerClient
from connector.spark.options import LedgerOptions
from connector.spark.recovery import ATTEMPT_TAG, PARTITION_TAG, STREAM_TAG
from connector.spark.stream_options import StreamOptions
from connector.spark.stream_write import LedgerStreamWriter
from connector.spark.write import LedgerWriter
from metadata import layout
from metadata.store import MetadataStore
from tests.harness.poll import poll_until

SCHEMA = StructType([StructField("id", LongType())])
STREAM = "events"
CHECKPOINT_QUERY_ID = "query-1"  # the id Spark would keep in the checkpoint


class TaskRunner:
    """Runs a writer's write() as a task attempt: TaskContext.get() answers the Task the calling thread runs."""

    def __init__(self, monkeypatch):
        self._current = threading.local()
        monkeypatch.setattr(TaskContext, "get", staticmethod(lambda: self._current.task))

    def run(self, writer, task: Task, batches: Iterable[pa.RecordBatch]):
        self._current.task = task
        return writer.write(iter(batches))


class PausedAttempt:
    """A task attempt that writes its first rows into its ledger and then stands still (a zombie: an executor
    paused or cut off) until finish() lets it go on. Runs in a thread."""

    def __init__(self, runner: TaskRunner, writer, task: Task):
        self.release = threading.Event()
        self.outcome: list = []
        self.thread = threading.Thread(target=self._run, args=(runner, writer, task), daemon=True)
        self.thread.start()

    def _input(self):
        yield id_batch(range(10_000, 11_000))  # 8 KB: cut into entries of 1 KiB, appended before the pause
        assert self.release.wait(120)
        yield id_batch(range(11_000, 12_000))

    def _run(self, runner: TaskRunner, writer, task: Task) -> None:
        try:
            self.outcome.append(runner.run(writer, task, self._input()))
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test checks
            self.outcome.append(exc)

    def finish(self):
        """What the attempt's write() returned or raised once let go."""
        self.release.set()
        self.thread.join(120)
        return self.outcome[0]


def id_batch(ids: range) -> pa.RecordBatch:
    return pa.record_batch([pa.array(list(ids), pa.int64())], names=["id"])


def options(uri: str, **more: str) -> dict[str, str]:
    return {"metadata": uri, "path": STREAM, "entryBytes": "1024", **more}


def batch_writer(uri: str, overwrite: bool = False) -> LedgerWriter:
    """The batch writer as Spark's driver prepares it for a write job."""
    return LedgerWriter.prepare(LedgerOptions.parse(options(uri)), SCHEMA, overwrite=overwrite)


def stream_sink(uri: str, tmp_path) -> LedgerStreamWriter:
    """The sink as Spark's driver makes it for a micro-batch of a query whose checkpoint holds CHECKPOINT_QUERY_ID."""
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir(exist_ok=True)
    (checkpoint / "metadata").write_text(json.dumps({"id": CHECKPOINT_QUERY_ID}))
    opts, stream_opts = StreamOptions.parse(options(uri, checkpointLocation=str(checkpoint)))
    return LedgerStreamWriter.prepare(opts, stream_opts, SCHEMA)


def existing(uri: str, ledger_ids: Iterable[int]) -> set[int]:
    """Those of the ledgers whose metadata exists."""
    with MetadataStore(uri) as store:
        return {i for i in ledger_ids if store.read(layout.ledger_path(i), bytes) is not None}


def attempt_ledger(uri: str, partition: int, attempt: int) -> int:
    """The ledger of this task attempt on STREAM, once it exists, found by its tags (a test may read every
    ledger of the cluster; a commit may not)."""
    wanted = (STREAM, str(partition), str(attempt))

    def tagged() -> list[int]:
        with LedgerClient(uri) as lc:
            return [i for i in lc.list_ledgers()
                    if tuple(lc.ledger_metadata(i).custom.get(t) for t in (STREAM_TAG, PARTITION_TAG, ATTEMPT_TAG)) == wanted]

    return poll_until(tagged, 60, what=f"the ledger of attempt {attempt} of partition {partition}")[0]
