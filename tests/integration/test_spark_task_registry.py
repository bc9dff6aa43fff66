"""Issue 14 item 2, DESIGN rule 15: a Spark commit's orphan sweep looks only at its own write job's or
streaming query's task ledgers, which the tasks name in a registry before they create them
(connector/spark/jobs.py), never at every ledger of the cluster; and still no task ledger slips past it.

Real ZooKeeper and storage nodes. The tasks run the executor code (LedgerWriter.write,
LedgerStreamWriter.write) with a stand-in TaskContext, and the driver code (commit, abort) runs as
Spark would call it, without a SparkSession.
"""
import contextlib
import dataclasses
import json
import random
import threading
import time

import pyarrow as pa
import pytest
from pyspark import TaskContext
from pyspark.sql.types import LongType, StructField, StructType

from connector.client import LedgerClient
from connector.spark.jobs import (
    WriteJobEndedError, create_task_ledger, job_registry, query_registry, register_task_ledger, task_entries,
)
from connector.spark.options import LedgerOptions
from connector.spark.recovery import ATTEMPT_TAG, JOB_TAG, PARTITION_TAG, STREAM_TAG
from connector.spark.stream_options import StreamOptions
from connector.spark.stream_write import BATCH_PROPERTY, BATCH_TAG, QUERY_TAG, LedgerStreamWriter
from connector.spark.write import LedgerWriter
from metadata import layout
from metadata.model import Fragment, LedgerMetadata, LedgerState
from metadata.store import MetadataStore
from tests.harness.poll import poll_until
from tests.integration.test_spark_commit_outcome import stream_ids

SCHEMA = StructType([StructField("id", LongType())])
STREAM = "events"
QUERY = "query-1"
UNRELATED = 500


@dataclasses.dataclass
class Task:
    """The TaskContext calls a write task makes."""

    partition: int
    attempt: int = 0
    batch: int = 0

    def partitionId(self) -> int:
        return self.partition

    def attemptNumber(self) -> int:
        return self.attempt

    def taskAttemptId(self) -> int:
        return self.partition * 100 + self.attempt

    def getLocalProperty(self, key: str) -> str | None:
        return str(self.batch) if key == BATCH_PROPERTY else None


@pytest.fixture
def task_context(monkeypatch):
    """TaskContext.get() answers the Task that the calling thread runs (run_task sets it)."""
    current = threading.local()
    monkeypatch.setattr(TaskContext, "get", staticmethod(lambda: current.task))
    return current


def run_task(task_context, writer, task: Task, batches):
    task_context.task = task
    return writer.write(iter(batches))


def id_batch(ids: range) -> pa.RecordBatch:
    return pa.record_batch([pa.array(list(ids), pa.int64())], names=["id"])


class PausedAttempt:
    """A task attempt that writes its first rows into its ledger and then stands still (a zombie: an executor
    paused or cut off), until released; then it tries to go on. Runs in a thread."""

    def __init__(self, task_context, writer, task: Task):
        self.release = threading.Event()
        self.outcome: list = []
        self.thread = threading.Thread(target=self._run, args=(task_context, writer, task), daemon=True)
        self.thread.start()

    def _input(self):
        yield id_batch(range(10_000, 11_000))  # 8 KB: cut into entries of 1 KiB, appended before the pause
        assert self.release.wait(120)
        yield id_batch(range(11_000, 12_000))

    def _run(self, task_context, writer, task: Task) -> None:
        try:
            self.outcome.append(run_task(task_context, writer, task, self._input()))
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test checks
            self.outcome.append(exc)

    def finish(self):
        self.release.set()
        self.thread.join(120)
        return self.outcome[0]


def options(uri: str, **more: str) -> dict[str, str]:
    return {"metadata": uri, "path": STREAM, "entryBytes": "1024", **more}


def batch_writer(uri: str) -> LedgerWriter:
    return LedgerWriter.prepare(LedgerOptions.parse(options(uri)), SCHEMA, overwrite=False)


def stream_sink(uri: str, tmp_path) -> LedgerStreamWriter:
    """The sink as Spark's driver makes it for a micro-batch, for a query whose checkpoint names QUERY."""
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir(exist_ok=True)
    (checkpoint / "metadata").write_text(json.dumps({"id": QUERY}))
    opts, stream_opts = StreamOptions.parse(options(uri, checkpointLocation=str(checkpoint)))
    return LedgerStreamWriter.prepare(opts, stream_opts, SCHEMA)


def unrelated_ledgers(store: MetadataStore, nodes, count: int) -> set[int]:
    """count closed ledgers of other jobs and queries: the history of a busy cluster (metadata only, which is
    all a sweep could ever look at)."""
    created = set()
    for i in range(count):
        tags = {STREAM_TAG: "other", JOB_TAG: f"other-job-{i}"} if i % 2 else {QUERY_TAG: "other-query", BATCH_TAG: str(i)}
        meta = LedgerMetadata(
            ledger_id=0, ensemble_size=3, write_quorum=3, ack_quorum=2,
            fragments=(Fragment(0, tuple(n.node_id for n in nodes)),), state=LedgerState.CLOSED,
            custom_metadata=tuple(sorted(tags.items())),
        )
        created.add(store.create_ledger(meta).value.ledger_id)
    return created


@dataclasses.dataclass
class MetadataReads:
    """Which ledgers' metadata the code under watch read, and how often it listed the ledgers of the cluster."""

    ledgers: set[int] = dataclasses.field(default_factory=set)
    listings: int = 0


@contextlib.contextmanager
def metadata_reads(monkeypatch):
    reads = MetadataReads()
    read_ledger, list_ledgers = MetadataStore.read_ledger, MetadataStore.list_ledgers

    def counted_read(store, ledger_id):
        reads.ledgers.add(ledger_id)
        return read_ledger(store, ledger_id)

    def counted_list(store):
        reads.listings += 1
        return list_ledgers(store)

    with monkeypatch.context() as patch:
        patch.setattr(MetadataStore, "read_ledger", counted_read)
        patch.setattr(MetadataStore, "list_ledgers", counted_list)
        yield reads


def existing(uri: str, ledger_ids) -> set[int]:
    with MetadataStore(uri) as store:
        return {i for i in ledger_ids if store.read(layout.ledger_path(i), bytes) is not None}


def attempt_ledger(uri: str, partition: int, attempt: int) -> int:
    """The ledger of this task attempt, once it exists, found by its tags (the test may read every ledger of the
    cluster; the sweep may not)."""
    wanted = (STREAM, str(partition), str(attempt))

    def tagged() -> list[int]:
        with LedgerClient(uri) as lc:
            return [i for i in lc.list_ledgers()
                    if tuple(lc.ledger_metadata(i).custom.get(t) for t in (STREAM_TAG, PARTITION_TAG, ATTEMPT_TAG)) == wanted]

    return poll_until(tagged, 60, what=f"the ledger of attempt {attempt} of partition {partition}")[0]


# -- the sweep reads its own ledgers only ------------------------------------------------------------------------


def test_batch_commit_reads_only_its_own_jobs_ledgers(cluster, store, metadata_uri, task_context, monkeypatch):
    nodes = cluster(3)
    writer = batch_writer(metadata_uri)
    zombie = PausedAttempt(task_context, writer, Task(0, attempt=0))
    zombie_ledger = attempt_ledger(metadata_uri, 0, 0)
    unrelated_ledgers(store, nodes, UNRELATED)
    messages = [run_task(task_context, writer, Task(0, attempt=1), [id_batch(range(0, 100))]),
                run_task(task_context, writer, Task(1), [id_batch(range(100, 300))])]
    own = {m.ledger_id for m in messages} | {zombie_ledger}

    with metadata_reads(monkeypatch) as reads:
        writer.commit(messages)

    assert reads.ledgers <= own, f"the commit read the metadata of {len(reads.ledgers - own)} ledgers of other jobs"
    assert reads.listings == 0, "the commit listed every ledger of the cluster"
    assert zombie_ledger not in existing(metadata_uri, [zombie_ledger])  # the paused attempt's orphan: swept
    assert stream_ids(metadata_uri) == list(range(300))
    assert isinstance(zombie.finish(), Exception)  # fenced, or its job ended: it cannot add rows any more
    assert not existing(metadata_uri, [zombie_ledger])
    assert stream_ids(metadata_uri) == list(range(300))


def test_streaming_commit_reads_only_its_own_querys_ledgers(
    cluster, store, metadata_uri, task_context, monkeypatch, tmp_path
):
    nodes = cluster(3)
    sink = stream_sink(metadata_uri, tmp_path)
    zombie = PausedAttempt(task_context, sink, Task(0, attempt=0, batch=0))
    zombie_ledger = attempt_ledger(metadata_uri, 0, 0)
    unrelated_ledgers(store, nodes, UNRELATED)
    messages = [run_task(task_context, sink, Task(0, attempt=1, batch=0), [id_batch(range(0, 100))]),
                run_task(task_context, sink, Task(1, batch=0), [id_batch(range(100, 300))])]
    own = {m.ledger_id for m in messages} | {zombie_ledger}

    with metadata_reads(monkeypatch) as reads:
        stream_sink(metadata_uri, tmp_path).commit(messages, 0)  # Spark commits on a fresh instance

    assert reads.ledgers <= own, f"the commit read the metadata of {len(reads.ledgers - own)} ledgers of other queries"
    assert reads.listings == 0, "the commit listed every ledger of the cluster"
    assert not existing(metadata_uri, [zombie_ledger])
    assert isinstance(zombie.finish(), Exception)
    assert not existing(metadata_uri, [zombie_ledger])
    assert stream_ids(metadata_uri) == list(range(300))


# -- the registry protocol: intent, ledger id, ledger --------------------------------------------------------------

CREATE = {"ensemble_size": 3, "write_quorum": 3, "ack_quorum": 2}


def test_an_entry_the_batch_sweep_withdrew_never_gets_its_ledger(cluster, metadata_uri):
    """A task registered its ledger id and stood still before creating the ledger; the job's commit ran meanwhile."""
    cluster(3)
    writer = batch_writer(metadata_uri)
    registry = job_registry(writer.job_id)
    with LedgerClient(metadata_uri) as lc:
        entry = register_task_ledger(lc.store, registry)
        writer.commit([])
        with pytest.raises(WriteJobEndedError, match="withdrew task ledger"):
            create_task_ledger(lc, entry, **CREATE)
        with pytest.raises(WriteJobEndedError, match="was committed or aborted already"):
            register_task_ledger(lc.store, registry)  # an ended job takes no more entries
        assert not existing(metadata_uri, [entry.ledger_id])
        assert lc.store.read(registry.path, bytes) is None


def test_an_entry_the_stream_sweep_withdrew_never_gets_its_ledger(cluster, metadata_uri, tmp_path):
    cluster(3)
    sink = stream_sink(metadata_uri, tmp_path)
    with LedgerClient(metadata_uri) as lc:
        entry = register_task_ledger(lc.store, query_registry(sink.query_id, 0))
        sink.commit([], 0)
        with pytest.raises(WriteJobEndedError, match="withdrew task ledger"):
            create_task_ledger(lc, entry, **CREATE)
        assert not existing(metadata_uri, [entry.ledger_id])
        assert task_entries(lc.store, query_registry(sink.query_id)) == []


def test_a_late_attempt_of_a_swept_batch_is_swept_with_the_next_batch(cluster, metadata_uri, tmp_path):
    """A query's registry stays open: an attempt of batch 0 that registers after batch 0's sweep keeps its entry
    until a later batch's sweep discards its ledger."""
    cluster(3)
    sink = stream_sink(metadata_uri, tmp_path)
    sink.commit([], 0)
    with LedgerClient(metadata_uri) as lc:
        entry = register_task_ledger(lc.store, query_registry(sink.query_id, 0))
        late = create_task_ledger(lc, entry, **CREATE)
        late.append(b"late")
        stream_sink(metadata_uri, tmp_path).commit([], 1)
        assert not existing(metadata_uri, [entry.ledger_id])
        assert task_entries(lc.store, query_registry(sink.query_id)) == []


ROUNDS = 20


@pytest.mark.parametrize("kind", ["batch job", "streaming query"])
def test_no_ledger_slips_past_a_concurrent_sweep(cluster, metadata_uri, tmp_path, kind):
    """A task registers and creates its ledger while the driver's sweep runs, over many random interleavings:
    afterwards every ledger that exists is named by an entry still in the registry (a later sweep finds it);
    a batch job's registry is closed, so none exists at all."""
    cluster(3)
    rng = random.Random(14)
    ids: list[int] = []
    with LedgerClient(metadata_uri) as lc:
        for batch in range(ROUNDS):
            if kind == "batch job":
                writer = batch_writer(metadata_uri)
                registry, sweep = job_registry(writer.job_id), lambda: writer.commit([])
            else:
                sink = stream_sink(metadata_uri, tmp_path)
                registry, sweep = query_registry(sink.query_id, batch), lambda: sink.commit([], batch)
            pauses = [rng.uniform(0, 0.05), rng.uniform(0, 0.3), rng.uniform(0, 0.1)]  # register, create, sweep

            def task():
                time.sleep(pauses[0])
                try:
                    entry = register_task_ledger(lc.store, registry)
                    ids.append(entry.ledger_id)
                    time.sleep(pauses[1])
                    create_task_ledger(lc, entry, **CREATE)
                except WriteJobEndedError:
                    pass

            attempt = threading.Thread(target=task)
            attempt.start()
            time.sleep(pauses[2])
            sweep()
            attempt.join(60)
            entries = {e.ledger_id for e in task_entries(lc.store, registry)}
            assert existing(metadata_uri, ids) <= entries, f"round {batch}: a task ledger is in no registry"
        if kind == "streaming query":
            stream_sink(metadata_uri, tmp_path).commit([], ROUNDS)
        assert not existing(metadata_uri, ids)


# -- the registry does not grow with history ---------------------------------------------------------------------


def test_a_batch_jobs_registry_is_removed_after_commit_and_after_abort(cluster, metadata_uri, task_context):
    cluster(3)
    committed = batch_writer(metadata_uri)
    committed.commit([run_task(task_context, committed, Task(0), [id_batch(range(0, 100))])])
    aborted = batch_writer(metadata_uri)
    messages = [run_task(task_context, aborted, Task(0), [id_batch(range(100, 200))])]
    aborted.abort(messages)

    with MetadataStore(metadata_uri) as store:
        assert store.read(job_registry(committed.job_id).path, bytes) is None
        assert store.read(job_registry(aborted.job_id).path, bytes) is None
    assert not existing(metadata_uri, [m.ledger_id for m in messages])
    assert stream_ids(metadata_uri) == list(range(100))


def test_a_querys_registry_is_emptied_by_commit_abort_and_replay(cluster, metadata_uri, task_context, tmp_path):
    cluster(3)
    with MetadataStore(metadata_uri) as store:
        sink = stream_sink(metadata_uri, tmp_path)

        def registry() -> list:
            return task_entries(store, query_registry(sink.query_id))

        died = register_task_ledger(store, query_registry(sink.query_id, 0))  # an attempt that died before its ledger
        batch_0 = [run_task(task_context, sink, Task(p, batch=0), [id_batch(range(100 * p, 100 * p + 100))])
                   for p in range(2)]
        stream_sink(metadata_uri, tmp_path).commit(batch_0, 0)
        assert registry() == []
        assert store.read(died.path, bytes) is None

        batch_1 = [run_task(task_context, sink, Task(0, batch=1), [id_batch(range(200, 300))])]
        stream_sink(metadata_uri, tmp_path).abort(batch_1, 1)
        assert registry() == []
        assert not existing(metadata_uri, [m.ledger_id for m in batch_1])

        # After a restart Spark writes batch 0 again and commits it: a replay, discarded.
        replay = [run_task(task_context, sink, Task(0, batch=0), [id_batch(range(0, 100))])]
        stream_sink(metadata_uri, tmp_path).commit(replay, 0)
        assert registry() == []
        assert not existing(metadata_uri, [m.ledger_id for m in replay])
        assert existing(metadata_uri, [m.ledger_id for m in batch_0]) == {m.ledger_id for m in batch_0}
    assert stream_ids(metadata_uri) == list(range(200))
