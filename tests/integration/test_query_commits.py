"""Streaming queries' commit records beside the head (metadata/query_commits.py) against a real ZooKeeper: a commit
writes its query's record in the head's multi and reads no other, records of older heads move out, conflicts on a
record are retried, and the records stay bounded with the least recently committed evicted first."""
import json

import pyarrow as pa
import pytest

from connector.spark.commit import COMMITTED, JOBS_KEPT, TaskLedger, new_stream, with_job
from connector.spark.janitor import record_aborted, run_key
from connector.spark.jobs import (WriteJobEndedError, forget_run, query_registry, register_task_ledger, remove_query,
                                  run_of, start_query, task_entries)
from connector.spark.options import LedgerOptions
from connector.spark.stream_write import LedgerStreamWriter
from connector.spark.write import ensure_stream
from metadata import layout, serde, streams
from metadata.model import StreamLedger, StreamRecord
from metadata.query_commits import committing, decode_batch, encode_batch, evict, query_commits, read_query_commit


def commit_batch(store, name: str, query: str, batch: int, ledger_id: int, before_write=None) -> bool:
    """The sink's commit as stream_write._register makes it; False if the query holds the batch already."""
    found = []

    def transform(record: StreamRecord):
        commit = read_query_commit(store, record, query)
        if commit.holds(batch):
            found.append(commit)
            return None
        offset = record.next_offset
        head, writes = committing(record.replace(tail=record.tail + (StreamLedger(ledger_id, offset, offset),)),
                                  commit, batch)
        if before_write is not None:
            before_write()
        return streams.Rewrite(head, also=writes)

    streams.update_stream(store, name, transform, read_back=True)
    return not found


def record_of(store, name: str, query: str):
    return store.read(layout.stream_query_path(name, query), decode_batch)


def test_a_commit_writes_its_querys_record_with_the_head_and_a_replay_is_found(store):
    streams.create_stream(store, new_stream("s"))
    assert commit_batch(store, "s", "query-a", 0, 10) and commit_batch(store, "s", "query-b", 0, 11)
    assert commit_batch(store, "s", "query-a", 1, 12)
    assert not commit_batch(store, "s", "query-a", 1, 13)   # a replay of batch 1: nothing written
    assert not commit_batch(store, "s", "query-a", 0, 14)
    head = streams.read_stream(store, "s").value
    assert [ledger.ledger_id for ledger in head.tail] == [10, 11, 12] and head.commits == ()
    assert record_of(store, "s", "query-a").value == 1 and record_of(store, "s", "query-b").value == 0
    assert query_commits(store, head) == [("query-b", 0), ("query-a", 1)]   # least recently committed first
    assert b"query-" not in store.zk.get(layout.stream_path("s"))[0]        # the head names no query


def old_head(store, commits) -> StreamRecord:
    """A head as software before these records wrote it (format version 2, records inside, no queries
    directory)."""
    head = StreamRecord("s", "arrow", tail=(StreamLedger(1, 0, 0),), commits=commits)
    data = json.loads(serde.encode_stream(head))
    data["format_version"] = 2
    store.create(layout.stream_path("s"), json.dumps(data).encode(), makepath=True)
    store.create(layout.stream_pages_path("s"))
    return head


def test_an_older_heads_records_count_and_move_out_with_the_next_commit(store):
    head = old_head(store, (("query-old", 5), ("query-a", 3)))
    old = streams.read_stream(store, "s").value
    assert old.commits == head.commits and read_query_commit(store, old, "query-a").holds(3)
    assert not commit_batch(store, "s", "query-a", 3, 20)   # the head's record counts: a replay

    assert commit_batch(store, "s", "query-a", 4, 21)   # creates the queries directory on the way
    moved = streams.read_stream(store, "s").value
    assert moved.commits == () and [ledger.ledger_id for ledger in moved.tail] == [1, 21]
    assert {q: record_of(store, "s", q).value for q in ("query-old", "query-a")} == {"query-old": 5, "query-a": 4}
    assert json.loads(store.zk.get(layout.stream_path("s"))[0])["format_version"] == serde.STREAM_FORMAT_VERSION


def test_of_an_old_record_and_a_newer_ones_the_larger_batch_counts(store):
    old_head(store, (("query-both", 7), ("query-newer", 2)))
    store.create(layout.stream_query_path("s", "query-both"), encode_batch(6), makepath=True)
    store.create(layout.stream_query_path("s", "query-newer"), encode_batch(4))
    assert read_query_commit(store, streams.read_stream(store, "s").value, "query-both").holds(7)
    assert commit_batch(store, "s", "query-a", 0, 21)
    assert {q: record_of(store, "s", q).value for q in ("query-both", "query-newer", "query-a")} == {
        "query-both": 7, "query-newer": 4, "query-a": 0}


def test_an_old_head_at_the_bound_moves_out_its_newest_records_and_no_eviction_takes_the_committing_ones(
        store, monkeypatch):
    monkeypatch.setattr("metadata.query_commits.KEPT", 4)
    old_head(store, tuple((f"query-{n}", n) for n in range(6)))   # least recently committed first
    assert commit_batch(store, "s", "query-new", 0, 30)
    kept = query_commits(store, streams.read_stream(store, "s").value)
    assert sorted(kept) == [("query-3", 3), ("query-4", 4), ("query-5", 5), ("query-new", 0)]
    assert evict(store, "s", spare=layout.stream_query_path("s", "query-new"), kept=3, low_water=1) == 3
    assert [q for q, _ in query_commits(store, streams.read_stream(store, "s").value)] == ["query-new"]


def test_a_record_created_changed_or_deleted_under_a_commit_is_read_again(store):
    streams.create_stream(store, new_stream("s"))
    path = layout.stream_query_path("s", "query-a")
    interfere = [lambda: store.create(path, encode_batch(0)),   # another run of the query committed batch 0
                 lambda: store.delete(path),                    # an eviction took it
                 lambda: store.create(path, encode_batch(0)),   # committed again
                 lambda: store.set_data(path, encode_batch(1))]  # and then batch 1

    def before_write():
        if interfere:
            interfere.pop(0)()

    assert not commit_batch(store, "s", "query-a", 1, 30, before_write)   # found batch 1 committed on re-read
    assert streams.read_stream(store, "s").value.tail == () and record_of(store, "s", "query-a").value == 1
    assert commit_batch(store, "s", "query-a", 2, 31)


def test_records_beyond_the_bound_go_least_recently_committed_first(store):
    streams.create_stream(store, new_stream("s"))
    for n, query in enumerate(["query-1", "query-2", "query-3", "query-4"]):
        commit_batch(store, "s", query, 0, 100 + n)
    spare = layout.stream_query_path("s", "query-5")
    assert evict(store, "s", spare, kept=4, low_water=3) == 0
    commit_batch(store, "s", "query-1", 1, 110)   # query-1 commits again: query-2 is now the oldest
    commit_batch(store, "s", "query-5", 0, 111)
    assert evict(store, "s", spare, kept=4, low_water=3) == 2
    head = streams.read_stream(store, "s").value
    assert query_commits(store, head) == [("query-4", 0), ("query-1", 1), ("query-5", 0)]
    assert not read_query_commit(store, head, "query-2").holds(0)


def test_a_record_committed_again_while_being_evicted_stays(store, monkeypatch):
    streams.create_stream(store, new_stream("s"))
    for n, query in enumerate(["query-1", "query-2"]):
        commit_batch(store, "s", query, 0, 200 + n)
    stat = store.stat

    def stat_then_commit(path):   # query-1 commits between the eviction's look and its delete
        found = stat(path)
        if path == layout.stream_query_path("s", "query-1"):
            store.set_data(path, encode_batch(1))
        return found

    monkeypatch.setattr(store, "stat", stat_then_commit)
    assert evict(store, "s", spare="", kept=1, low_water=1) == 0
    monkeypatch.undo()
    assert record_of(store, "s", "query-1").value == 1 and record_of(store, "s", "query-2").value == 0


def test_the_head_holds_no_query_records_however_many_queries_wrote(store):
    streams.create_stream(store, new_stream("s"))
    for n in range(300):
        commit_batch(store, "s", f"query-{n:04d}", 0, 1000 + n)
    head = json.loads(store.zk.get(layout.stream_path("s"))[0])
    assert "commits" not in head and len(store.children(layout.stream_queries_path("s"))) == 300


def test_the_sinks_commits_keep_the_records_bounded_and_skip_a_replay(store, metadata_uri, monkeypatch):
    """Through LedgerStreamWriter.commit (batches without rows: no ledger to write, no storage node needed)."""
    monkeypatch.setattr("metadata.query_commits.KEPT", 2)
    monkeypatch.setattr("metadata.query_commits.LOW_WATER", 2)
    ensure_stream(store, "s")
    for query in ("query-1", "query-2", "query-3"):
        start_query(store, query)
        sink = LedgerStreamWriter(LedgerOptions.parse({"metadata": metadata_uri, "path": "s"}),
                                  pa.schema([("id", pa.int64())]), query)
        sink.commit([], 0)
        sink.commit([], 1)
    sink.commit([], 1)   # a replay of query-3's batch 1
    head = streams.read_stream(store, "s").value
    assert query_commits(store, head) == [("query-2", 1), ("query-3", 1)]
    assert store.stat(layout.stream_query_path("s", "query-3")).version == 1   # created, then set once


def started_run(store, metadata_uri: str, driver: str) -> LedgerStreamWriter:
    """The sink of query-1 on stream s, its run by `driver` recorded in the query's registry as prepare records it."""
    ensure_stream(store, "s")
    run = start_query(store, "query-1", "s", driver)
    return LedgerStreamWriter(LedgerOptions.parse({"metadata": metadata_uri, "path": "s"}),
                              pa.schema([("id", pa.int64())]), "query-1", driver_id=driver, run=run)


def test_a_landed_batch_is_reported_committed_also_after_a_janitor_fenced_its_run(store, metadata_uri):
    """Rule 16: the commit landed, its reply was lost, and a janitor (finding the driver's registration gone)
    recorded the run aborted before the read-back. The read-back finds the batch and reports it committed; the
    run's registry is left to the janitor."""
    sink = started_run(store, metadata_uri, "driver-gone")
    sink.commit([], 0)
    record_aborted(store, "s", run_key("query-1", "driver-gone", sink.run))
    sink.commit([], 0)   # the read-back of batch 0: committed, not failed
    with pytest.raises(WriteJobEndedError, match="Restart the query from its checkpoint"):
        sink.commit([], 1)   # a batch that did not land is refused
    assert read_query_commit(store, streams.read_stream(store, "s").value, "query-1").last_batch == 0


def test_a_run_a_janitor_fenced_stays_fenced_after_its_mark_left_the_head(store, metadata_uri):
    """Helper audit 2026-11-29 finding 2: the janitor's mark that a run is aborted is one of the head's newest
    JOBS_KEPT job outcomes. Once that many batch jobs had ended on the stream, a commit of the fenced run (its driver
    only cut off, still running) registered ledgers the janitor had deleted. The run's absence from the query's
    registry, which the janitor removes after the mark, fences it now as well."""
    sink = started_run(store, metadata_uri, "driver-cut-off")
    sink.commit([], 0)
    # The janitor, finding the driver's registration gone: the mark, the run's ledgers discarded, the run removed.
    record_aborted(store, "s", run_key("query-1", "driver-cut-off", sink.run))
    forget_run(store, "query-1", "driver-cut-off")
    remove_query(store, "query-1")
    for n in range(JOBS_KEPT):   # batch jobs end on the stream meanwhile: the mark leaves the head
        streams.update_stream(store, "s", lambda r, n=n: with_job(r, f"job-{n}", COMMITTED))
    with pytest.raises(WriteJobEndedError, match="Restart the query from its checkpoint"):
        sink.commit([TaskLedger(0, 987654, 3, 1)], 1)   # a ledger the janitor deleted
    head = streams.read_stream(store, "s").value
    assert [ledger.ledger_id for ledger in head.tail] == []
    assert read_query_commit(store, head, "query-1").last_batch == 0


def test_an_abort_of_a_fenced_run_leaves_the_next_runs_entries_alone_after_the_mark_left_the_head(store, metadata_uri):
    """Review 2026-11-29: the abort of a run the janitor fenced leaves the query's registry alone (a later run of the
    query may have entries there). It looked only at the mark, which leaves the head after JOBS_KEPT job outcomes:
    the cut-off driver's abort then withdrew the new run's uncommitted task ledgers, which that run's commit would
    have put on the stream deleted."""
    sink = started_run(store, metadata_uri, "driver-cut-off")
    sink.commit([], 0)
    record_aborted(store, "s", run_key("query-1", "driver-cut-off", sink.run))
    forget_run(store, "query-1", "driver-cut-off")
    remove_query(store, "query-1")
    for n in range(JOBS_KEPT):
        streams.update_stream(store, "s", lambda r, n=n: with_job(r, f"job-{n}", COMMITTED))
    start_query(store, "query-1", "s", "driver-2")          # the query again, under another driver
    entry = register_task_ledger(store, query_registry("query-1", 1))   # its batch 1's task, not committed yet
    sink.abort([], 1)                                        # the cut-off driver's abort of its batch 1
    assert task_entries(store, query_registry("query-1")) == [entry]


def test_a_run_removed_between_the_commits_read_and_its_cas_does_not_commit(store, metadata_uri, monkeypatch):
    """Review 2026-11-29: the commit's look at its run was a read before the CAS; the run is now also checked in the
    commit's multi, so a janitor that removes it in between (its mark gone from the head) cannot let it land."""
    sink = started_run(store, metadata_uri, "driver-cut-off")
    sink.commit([], 0)
    real, removed = streams.write_stream, []

    def write_stream(store_, record, expected_version):
        if not removed:
            removed.append(True)
            forget_run(store, "query-1", "driver-cut-off")
        return real(store_, record, expected_version)

    monkeypatch.setattr(streams, "write_stream", write_stream)
    with pytest.raises(WriteJobEndedError, match="Restart the query from its checkpoint"):
        sink.commit([TaskLedger(0, 987654, 3, 1)], 1)
    head = streams.read_stream(store, "s").value
    assert removed and [ledger.ledger_id for ledger in head.tail] == []


def test_a_run_cannot_commit_after_a_janitor_died_between_discarding_its_ledgers_and_removing_it(
        store, metadata_uri, monkeypatch):
    """The run's existence was the fence that outlives the janitor's mark on the head, but the janitor removes the run
    only after it discarded the run's ledgers. A janitor that died in between left the run, and once JOBS_KEPT batch
    jobs had ended on the stream, the cut-off driver's commit registered the discarded ledger. The janitor now fences
    the run before it discards anything, and the commit checks the fence in its multi."""
    from connector.client import LedgerClient
    from connector.spark import janitor
    from metadata.errors import LedgerError

    sink = started_run(store, metadata_uri, "driver-cut-off")   # no registration of that driver: it is gone
    sink.commit([], 0)
    entry = register_task_ledger(store, query_registry("query-1", 1))   # batch 1's task

    def dies(*_):
        raise LedgerError("the janitor's process died here")

    monkeypatch.setattr(janitor, "remove_fenced_runs", dies)
    [found] = janitor.find_registries(store, "s")
    with LedgerClient(metadata_uri) as lc:
        outcome = janitor.clean(lc, found, [b""])
    assert outcome.error and task_entries(store, query_registry("query-1")) == []   # batch 1's entry dropped
    for n in range(JOBS_KEPT):   # batch jobs end on the stream meanwhile: the mark leaves the head
        streams.update_stream(store, "s", lambda r, n=n: with_job(r, f"job-{n}", COMMITTED))
    with pytest.raises(WriteJobEndedError, match="Restart the query from its checkpoint"):
        sink.commit([TaskLedger(0, entry.ledger_id, 3, 1)], 1)
    head = streams.read_stream(store, "s").value
    assert [ledger.ledger_id for ledger in head.tail] == []


def _janitor_meets_a_new_run(store, monkeypatch, after_aborted=None):
    """A janitor elsewhere finds query-1 with only its gone run (driver-gone), and a new run (driver-2: the same
    driver, its registration changed mid-batch) starts right after the janitor read the runs. after_aborted(): run
    after the janitor recorded the gone run aborted, before its sweep."""
    from connector.spark import janitor

    real_runs, real_aborted, calls = janitor.query_runs, janitor.record_aborted, []

    def query_runs(store_, query_id):
        runs = real_runs(store_, query_id)
        calls.append(query_id)
        if len(calls) == 2:   # the janitor's second look, just before it cleans: the new run starts after it
            start_query(store, "query-1", "s", "driver-2")
        return runs

    def record_aborted(store_, stream, key):
        record = real_aborted(store_, stream, key)
        if after_aborted is not None:
            after_aborted()
        return record

    monkeypatch.setattr(janitor, "query_runs", query_runs)
    monkeypatch.setattr(janitor, "record_aborted", record_aborted)
    [found] = janitor.find_registries(store, "s")
    return found


def test_a_commit_by_a_new_run_of_the_query_does_not_land_the_ledgers_a_janitor_withdrew(
        store, metadata_uri, monkeypatch):
    """Helper audit 2026-11-29: the janitor's fence is per run. A commit by another run of the query (the driver's
    registration changed mid-batch) registered the batch's ledgers that the janitor had withdrawn and deleted. Each
    ledger's registry entry is now checked in the commit's multi."""
    from connector.client import LedgerClient
    from connector.spark import janitor

    started_run(store, metadata_uri, "driver-gone").commit([], 0)
    entry = register_task_ledger(store, query_registry("query-1", 1))   # batch 1's task, under driver-gone
    found = _janitor_meets_a_new_run(store, monkeypatch)
    with LedgerClient(metadata_uri) as lc:
        outcome = janitor.clean(lc, found, [b""])
    assert not outcome.kept and "a run was restarted" in outcome.error   # the new run's registry stays
    sink = LedgerStreamWriter(LedgerOptions.parse({"metadata": metadata_uri, "path": "s"}),
                              pa.schema([("id", pa.int64())]), "query-1", driver_id="driver-2",
                              run=run_of(store, "query-1", "driver-2").value.run)
    with pytest.raises(WriteJobEndedError, match="withdrew task ledgers of batch 1"):
        sink.commit([TaskLedger(0, entry.ledger_id, 3, 1)], 1)
    assert [ledger.ledger_id for ledger in streams.read_stream(store, "s").value.tail] == []


def test_a_janitor_keeps_a_ledger_a_new_run_of_the_query_committed_while_it_swept(store, metadata_uri, monkeypatch):
    """Helper audit 2026-11-29: the janitor read which ledgers the stream holds, then withdrew and deleted the others.
    A commit by another run of the query (the driver's registration changed mid-batch) that landed in between lost its
    ledgers to the sweep. The sweep now withdraws first and reads the stream after."""
    from connector.client import LedgerClient
    from connector.spark import janitor

    started_run(store, metadata_uri, "driver-gone").commit([], 0)
    entry = register_task_ledger(store, query_registry("query-1", 1))
    sink = LedgerStreamWriter(LedgerOptions.parse({"metadata": metadata_uri, "path": "s"}),
                              pa.schema([("id", pa.int64())]), "query-1", driver_id="driver-2")

    def new_run_commits():
        sink.run = run_of(store, "query-1", "driver-2").value.run
        sink._register(lc, [TaskLedger(0, entry.ledger_id, 3, 1)], 1)

    found = _janitor_meets_a_new_run(store, monkeypatch, after_aborted=new_run_commits)
    with LedgerClient(metadata_uri) as lc:
        outcome = janitor.clean(lc, found, [b""])
    assert outcome.kept == [entry.ledger_id] and outcome.deleted == []
    assert [ledger.ledger_id for ledger in streams.read_stream(store, "s").value.tail] == [entry.ledger_id]


@pytest.mark.parametrize("janitor_got_to", ["the removal", "the fence"])
def test_a_query_whose_run_a_janitor_fenced_commits_again_under_the_same_driver(
        cluster, store, metadata_uri, monkeypatch, janitor_got_to):
    """Helper audit 2026-11-29: a janitor that found the driver's registration gone for a moment (a keeper's session
    expired; the keeper registers the same id again) fenced the run, recorded it aborted and removed it. Every later
    commit of the query under that driver, also after a restart from the checkpoint in the same driver, was refused
    for as long as the driver lived (the run's mark stays on a stream that only streaming queries write). A run
    fenced so is now restarted with a new run id, whose commits land; the fenced run's stay refused."""
    from pyspark.sql.types import LongType, StructField, StructType

    from connector.spark import driver as spark_driver
    from connector.spark.jobs import fence_run
    from connector.spark.stream_options import StreamOptions

    monkeypatch.setattr(spark_driver.DriverProcess, "new_driver_id", lambda self: "driver-back")
    cluster(3)   # a query's start checks the nodes
    options = LedgerOptions.parse({"metadata": metadata_uri, "path": "s"})
    monkeypatch.setattr(StreamOptions, "query_id", lambda self: "query-1")
    schema = StructType([StructField("id", LongType())])
    old = LedgerStreamWriter.prepare(options, StreamOptions(), schema)
    old.commit([], 0)
    # A janitor, finding the driver's registration gone for a moment: the fence, the mark, the run removed (or the
    # janitor stopped before it removed the run: then the query's next writer restarts the fenced run).
    fence_run(store, "query-1", "driver-back", old.run)
    record_aborted(store, "s", run_key("query-1", "driver-back", old.run))
    if janitor_got_to == "the removal":
        forget_run(store, "query-1", "driver-back")
    with pytest.raises(WriteJobEndedError, match="Restart the query from its checkpoint"):
        old.commit([TaskLedger(0, register_task_ledger(store, query_registry("query-1", 1)).ledger_id, 3, 1)], 1)
    new = LedgerStreamWriter.prepare(options, StreamOptions(), schema)   # the restart, under the same driver
    entry = register_task_ledger(store, query_registry("query-1", 1))
    new.commit([TaskLedger(0, entry.ledger_id, 3, 1)], 1)
    head = streams.read_stream(store, "s").value
    assert [ledger.ledger_id for ledger in head.tail] == [entry.ledger_id]
    with pytest.raises(WriteJobEndedError, match="Restart the query from its checkpoint"):   # the fenced run's
        old.commit([TaskLedger(0, register_task_ledger(store, query_registry("query-1", 2)).ledger_id, 3, 1)], 2)


def test_a_query_restarted_again_and_again_keeps_only_its_live_runs(cluster, store, metadata_uri, monkeypatch):
    """Review 2026-11-29 (day 300): a running query's registry is never abandoned, so the janitor never removed the
    runs of its earlier drivers: a query restarted once a day held a run per restart, read by every job start. A run
    that starts now retires the query's runs whose drivers are gone (fenced, recorded aborted, removed)."""
    from pyspark.sql.types import LongType, StructField, StructType

    from connector.spark.jobs import query_runs
    from connector.spark.stream_options import StreamOptions

    cluster(3)
    ensure_stream(store, "s")
    gone = {f"driver-gone-{n}": start_query(store, "query-1", "s", f"driver-gone-{n}") for n in range(3)}
    old = LedgerStreamWriter(LedgerOptions.parse({"metadata": metadata_uri, "path": "s"}),
                             pa.schema([("id", pa.int64())]), "query-1", driver_id="driver-gone-0",
                             run=gone["driver-gone-0"])
    monkeypatch.setattr(StreamOptions, "query_id", lambda self: "query-1")
    sink = LedgerStreamWriter.prepare(LedgerOptions.parse({"metadata": metadata_uri, "path": "s"}), StreamOptions(),
                                      StructType([StructField("id", LongType())]))
    assert set(query_runs(store, "query-1")) == {sink.driver_id}
    with pytest.raises(WriteJobEndedError, match="Restart the query from its checkpoint"):   # a gone run's commit
        old.commit([TaskLedger(0, register_task_ledger(store, query_registry("query-1", 0)).ledger_id, 3, 1)], 0)


def test_a_janitor_leaves_a_run_its_driver_restarted_after_the_fence(store, metadata_uri, monkeypatch):
    """Review 2026-11-29: the janitor removed the runs it had fenced whatever they were by then. A driver back under
    the same id that restarted its fenced run (a new run id) in between lost the new run: its next commit was
    refused. The janitor now removes a run only at the version it fenced."""
    from connector.client import LedgerClient
    from connector.spark import janitor
    from connector.spark.jobs import restart_run

    started_run(store, metadata_uri, "driver-back").commit([], 0)
    real = janitor.record_aborted
    restarted = []

    def record_aborted_then_the_driver_restarts(store_, stream, key):
        record = real(store_, stream, key)
        restarted.append(restart_run(store, "query-1", "s", "driver-back", run_of(store, "query-1", "driver-back")))
        return record

    monkeypatch.setattr(janitor, "record_aborted", record_aborted_then_the_driver_restarts)
    [found] = janitor.find_registries(store, "s")
    with LedgerClient(metadata_uri) as lc:
        outcome = janitor.clean(lc, found, [b""])
    assert "a run was restarted" in outcome.error   # the registry stays, with the restarted run
    run = run_of(store, "query-1", "driver-back")
    assert run is not None and run.value.run == restarted[0] and not run.value.fenced


def test_a_janitor_keeps_the_fenced_runs_while_tasks_of_them_register_ledgers(store, metadata_uri, monkeypatch):
    """Review 2026-11-29: a fence stops a run's commits, not its tasks. A task that registered a ledger after the
    janitor listed the query's entries kept the registry from being removed, while the janitor removed the runs: a
    registry naming no driver, which no janitor cleans (only `ledger jobs --apply --legacy`). The runs now stay,
    fenced, while entries are left, and the next janitor cleans the rest."""
    from connector.client import LedgerClient
    from connector.spark import janitor
    from connector.spark.jobs import query_runs

    started_run(store, metadata_uri, "driver-gone").commit([], 0)
    real = janitor.record_aborted
    late = []

    def record_aborted_while_a_task_registers(store_, stream, key):
        late.append(register_task_ledger(store, query_registry("query-1", 1)))   # after the janitor's listing
        return real(store_, stream, key)

    monkeypatch.setattr(janitor, "record_aborted", record_aborted_while_a_task_registers)
    [found] = janitor.find_registries(store, "s")
    with LedgerClient(metadata_uri) as lc:
        first = janitor.clean(lc, found, [b""])
        assert first.error and set(query_runs(store, "query-1")) == {"driver-gone"}
        monkeypatch.undo()
        [found] = janitor.find_registries(store, "s")
        assert found.state == janitor.ABANDONED
        second = janitor.clean(lc, found, [b""])
    assert not second.error and not store.exists(query_registry("query-1").path)


def test_a_commit_landing_right_after_a_sweep_reads_what_the_stream_holds_is_refused(store, metadata_uri, monkeypatch):
    """Review 2026-11-29: pins the sweep's order. A commit by another run of the query that would land just after the
    janitor read which ledgers the stream holds must find its entries withdrawn already (it is refused); read before
    the withdraws, the sweep would delete a ledger the stream had just taken."""
    from connector.client import LedgerClient
    from connector.spark import janitor

    started_run(store, metadata_uri, "driver-gone").commit([], 0)
    entry = register_task_ledger(store, query_registry("query-1", 1))
    sink = LedgerStreamWriter(LedgerOptions.parse({"metadata": metadata_uri, "path": "s"}),
                              pa.schema([("id", pa.int64())]), "query-1", driver_id="driver-2")
    real_held, refused = janitor.held_by_streams, []

    def held_then_a_commit_lands(store_, streams_, ledger_ids):
        held = real_held(store_, streams_, ledger_ids)
        sink.run = run_of(store, "query-1", "driver-2").value.run
        try:
            sink._register(lc, [TaskLedger(0, entry.ledger_id, 3, 1)], 1)
        except WriteJobEndedError as exc:
            refused.append(exc)
        return held

    monkeypatch.setattr(janitor, "held_by_streams", held_then_a_commit_lands)
    found = _janitor_meets_a_new_run(store, monkeypatch)
    with LedgerClient(metadata_uri) as lc:
        janitor.clean(lc, found, [b""])
    assert refused and [ledger.ledger_id for ledger in streams.read_stream(store, "s").value.tail] == []


def test_a_janitor_fences_only_the_run_it_found_gone_not_the_one_its_driver_restarted(
        store, metadata_uri, monkeypatch):
    """Review 2 of 2026-11-29: the janitor fenced and removed a run by its driver's name. A driver back under the same
    id that had restarted its run (a new run id) just after the janitor read the runs lost the new run: fenced, then
    removed, and its next commit refused. The fence now names the run id it found."""
    from connector.client import LedgerClient
    from connector.spark import janitor
    from connector.spark.jobs import restart_run

    started_run(store, metadata_uri, "driver-back").commit([], 0)
    real_runs, calls, restarted = janitor.query_runs, [], []

    def query_runs_then_the_driver_restarts(store_, query_id):
        runs = real_runs(store_, query_id)
        calls.append(query_id)
        if len(calls) == 2:   # the janitor's look just before it cleans
            restarted.append(restart_run(store, "query-1", "s", "driver-back", run_of(store, "query-1",
                                                                                        "driver-back")))
        return runs

    monkeypatch.setattr(janitor, "query_runs", query_runs_then_the_driver_restarts)
    [found] = janitor.find_registries(store, "s")
    with LedgerClient(metadata_uri) as lc:
        outcome = janitor.clean(lc, found, [b""])
    assert outcome.error   # the registry stays: a run of a live driver is in it
    run = run_of(store, "query-1", "driver-back")
    assert run is not None and run.value.run == restarted[0] and not run.value.fenced
