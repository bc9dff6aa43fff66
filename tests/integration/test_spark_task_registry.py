"""The task registries (connector/spark/jobs.py): a task names its ledger in its write job's or streaming
query's registry before creating it, so that no task ledger slips past the driver's sweep whatever the
interleaving (intent, ledger id, ledger), and the registries do not grow with history.

Real ZooKeeper and storage nodes; tasks and commits without a SparkSession (tests/harness/spark_tasks.py).
The sweep's cost is tested in test_spark_sweep_cost.py.
"""
import random
import threading
import time

import pytest

from connector.client import LedgerClient
from connector.spark.jobs import (
    WriteJobEndedError, create_task_ledger, fence_run, job_registry, query_registry, register_task_ledger,
    restart_run, run_of, run_path, start_query, task_entries,
)
from connector.spark.recovery import discard
from metadata import layout, streams
from metadata.model import StreamRecord
from metadata.store import MetadataStore
from tests.harness.lost_reply import LostReplies
from tests.harness.spark_tasks import Task, TaskRunner, batch_writer, existing, id_batch, stream_sink
from tests.integration.test_spark_commit_outcome import stream_ids


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


def test_a_batch_jobs_registry_is_removed_after_commit_and_after_abort(cluster, metadata_uri, monkeypatch):
    cluster(3)
    tasks = TaskRunner(monkeypatch)
    committed = batch_writer(metadata_uri)
    committed.commit([tasks.run(committed, Task(0), [id_batch(range(0, 100))])])
    aborted = batch_writer(metadata_uri)
    messages = [tasks.run(aborted, Task(0), [id_batch(range(100, 200))])]
    aborted.abort(messages)

    with MetadataStore(metadata_uri) as store:
        assert store.read(job_registry(committed.job_id).path, bytes) is None
        assert store.read(job_registry(aborted.job_id).path, bytes) is None
    assert not existing(metadata_uri, [m.ledger_id for m in messages])
    assert stream_ids(metadata_uri) == list(range(100))


def test_a_querys_registry_is_emptied_by_commit_abort_and_replay(cluster, metadata_uri, monkeypatch, tmp_path):
    cluster(3)
    tasks = TaskRunner(monkeypatch)
    with MetadataStore(metadata_uri) as store:
        sink = stream_sink(metadata_uri, tmp_path)

        def registry() -> list:
            return task_entries(store, query_registry(sink.query_id))

        died = register_task_ledger(store, query_registry(sink.query_id, 0))  # an attempt that died before its ledger
        batch_0 = [tasks.run(sink, Task(p, batch=0), [id_batch(range(100 * p, 100 * p + 100))])
                   for p in range(2)]
        stream_sink(metadata_uri, tmp_path).commit(batch_0, 0)
        assert registry() == []
        assert store.read(died.path, bytes) is None

        batch_1 = [tasks.run(sink, Task(0, batch=1), [id_batch(range(200, 300))])]
        stream_sink(metadata_uri, tmp_path).abort(batch_1, 1)
        assert registry() == []
        assert not existing(metadata_uri, [m.ledger_id for m in batch_1])

        # After a restart Spark writes batch 0 again and commits it: a replay, discarded.
        replay = [tasks.run(sink, Task(0, batch=0), [id_batch(range(0, 100))])]
        stream_sink(metadata_uri, tmp_path).commit(replay, 0)
        assert registry() == []
        assert not existing(metadata_uri, [m.ledger_id for m in replay])
        assert existing(metadata_uri, [m.ledger_id for m in batch_0]) == {m.ledger_id for m in batch_0}
    assert stream_ids(metadata_uri) == list(range(200))


def test_a_ledger_deleted_while_a_sweep_recovers_it_counts_as_discarded(cluster, metadata_uri, monkeypatch):
    """An abort's sweep discards a task's OPEN ledger (fence, recover, delete) while the failing task deletes it
    itself: the recovery finds it gone. The ledger is discarded, and the sweep goes on; it used to fail the
    abort ("ledger N was deleted while being updated"), which left the batch's registry for a later sweep."""
    cluster(3)
    with LedgerClient(metadata_uri) as task_client, LedgerClient(metadata_uri) as driver_client:
        ledger = task_client.create_ledger(3, 3, 2, password=b"pw")
        ledger.append(b"a row")
        recover = driver_client.recover_ledger_with_retry

        def deleted_by_the_task_first(ledger_id, password=b"", retry=None):
            task_client.delete_ledger(ledger_id)
            return recover(ledger_id, password, retry)
        monkeypatch.setattr(driver_client, "recover_ledger_with_retry", deleted_by_the_task_first)
        discard(driver_client, ledger.ledger_id, b"pw")
        assert ledger.ledger_id not in driver_client.list_ledgers()


# -- registry writes whose reply was lost (rule 16) ------------------------------------------------------------------

def test_a_query_run_whose_create_lost_its_reply_is_started(store, monkeypatch):
    """Lost-reply audit 2026-11-29 (finding 3): the create of a query's run (a streaming sink's start) raised."""
    lost = LostReplies(monkeypatch, lambda operation, path, kwargs: operation == "create" and path == run_path(
        "query-1", "driver-1"))
    run = start_query(store, "query-1", "events", "driver-1")
    assert lost.lost and run and run_of(store, "query-1", "driver-1").value.run == run


def test_a_restarted_run_whose_write_lost_its_reply_is_restarted(store, monkeypatch):
    """Lost-reply audit 2026-11-29 (finding 3): the compare-and-set of a fenced run's restart raised."""
    fenced = start_query(store, "query-1", "events", "driver-1")
    fence_run(store, "query-1", "driver-1", fenced)
    stale = run_of(store, "query-1", "driver-1")
    lost = LostReplies(monkeypatch, lambda operation, path, kwargs: operation == "set" and path == run_path(
        "query-1", "driver-1"))
    run = restart_run(store, "query-1", "events", "driver-1", stale)
    stored = run_of(store, "query-1", "driver-1")
    assert lost.lost and run != fenced and stored.value.run == run and not stored.value.fenced


def test_a_stream_directory_whose_create_lost_its_reply_is_there(store, monkeypatch):
    """Lost-reply audit 2026-11-29 (finding 3): an overwrite's commit creates its stream's cuts directory (a stream
    of older software has none) before its CAS; a lost reply failed the commit."""
    streams.create_stream(store, StreamRecord("events", "arrow"))
    cuts = layout.stream_cuts_path("events")
    store.delete(cuts)
    lost = LostReplies(monkeypatch, lambda operation, path, kwargs: operation == "create" and path == cuts)
    streams.create_directory(store, "events", cuts)
    assert lost.lost and store.exists(cuts)


def test_a_query_whose_registry_a_janitor_removed_between_batches_goes_on(cluster, metadata_uri, monkeypatch,
                                                                          tmp_path):
    """The query's driver was away for a moment (its ZooKeeper session expired: a pause, a cut from ZooKeeper), and a
    job's start took the query for stopped and removed its registry between two batches (janitor.
    remove_stopped_query). The driver came back, and every task of its next batch was refused, for good: only a
    query's start recorded its run (session-expiry audit, 2026-11-29)."""
    from connector.spark import janitor
    from connector.spark.jobs import query_ids

    cluster(3)
    tasks = TaskRunner(monkeypatch)
    with MetadataStore(metadata_uri) as store:
        sink = stream_sink(metadata_uri, tmp_path)
        batch_0 = [tasks.run(sink, Task(p, batch=0), [id_batch(range(100 * p, 100 * p + 100))]) for p in range(2)]
        stream_sink(metadata_uri, tmp_path).commit(batch_0, 0)
        [found] = [f for f in janitor.find_registries(store) if f.owner == sink.query_id]
        monkeypatch.setattr(janitor.registry, "writer_alive", lambda *_, **__: False)   # its session expired
        assert janitor.remove_stopped_query(store, found)
        monkeypatch.undo()
        assert sink.query_id not in query_ids(store)
        tasks = TaskRunner(monkeypatch)
        batch_1 = [tasks.run(sink, Task(p, batch=1), [id_batch(range(200 + 100 * p, 300 + 100 * p))])
                   for p in range(2)]
        stream_sink(metadata_uri, tmp_path).commit(batch_1, 1)
    assert stream_ids(metadata_uri) == list(range(400))
