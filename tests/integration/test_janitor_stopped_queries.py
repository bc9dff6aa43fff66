"""A streaming query that stops leaves its registry behind: its runs, which name its driver (each batch's task
entries are swept as it commits). Nothing removed them while no job started on their stream, and every driver's
keeper reads every registry every 10 s, so a cluster where queries come and go paid for every query it ever ran.
A job's or query's start now removes up to 16 of them on other streams: those whose
drivers are gone and that hold no task entries. Real ZooKeeper, the real janitor."""
from __future__ import annotations

from connector.client import LedgerClient
from connector.spark import janitor
from connector.spark.jobs import (create_task_ledger, job_ids, job_registry, query_ids, query_registry,
                                  register_task_ledger, start_job, start_query)
from metadata import registry


def test_a_start_removes_what_stopped_queries_left_on_other_streams_and_nothing_else(store, metadata_uri):
    stopped = [f"stopped-{i}" for i in range(janitor.STOPPED_QUERIES_PER_START + 3)]
    for i, query in enumerate(stopped):
        start_query(store, query, "other", driver=f"gone-{i}")
    live = registry.register_writer(store, "live-driver")
    start_query(store, "running", "other", driver="live-driver")
    register_task_ledger(store, query_registry("running", 7))
    kept = {"running"}
    try:
        with LedgerClient(metadata_uri) as lc:
            janitor.clean_stream(lc, "mine", b"")
            left = set(query_ids(store)) - kept
            # at most STOPPED_QUERIES_PER_START a start, and one more cleaned as an abandoned registry elsewhere
            assert len(left) in (2, 3) and left < set(stopped)
            janitor.clean_stream(lc, "mine", b"")
        assert set(query_ids(store)) == kept
    finally:
        live.close()


def test_registries_it_cannot_remove_do_not_take_every_starts_turn(store, metadata_uri):
    """Registries of queries whose drivers died with task ledgers left are looked at and left by the stopped
    queries' sweep (one of them a start cleans as an abandoned registry elsewhere, below); they used to take up
    all of a start's turns when their ids sorted first."""
    for i in range(janitor.STOPPED_QUERIES_PER_START + 4):
        start_query(store, f"a-busy-{i:02}", "other", driver=f"gone-busy-{i}")
        register_task_ledger(store, query_registry(f"a-busy-{i:02}", 0))
    for i in range(3):
        start_query(store, f"z-stopped-{i}", "other", driver=f"gone-{i}")
    with LedgerClient(metadata_uri) as lc:
        janitor.clean_stream(lc, "mine", b"")
    assert not [q for q in query_ids(store) if q.startswith("z-stopped-")]
    assert len([q for q in query_ids(store) if q.startswith("a-busy-")]) >= janitor.STOPPED_QUERIES_PER_START + 3


def test_a_start_cleans_an_abandoned_registry_of_a_stream_no_job_starts_on_again(store, metadata_uri, cluster):
    """Day-300 audit 2026-11-29: a write job whose driver died mid-job on a stream never written again (a
    notebook's scratch stream) kept its registry and task ledgers for good: only its own stream's next start or
    `ledger jobs --apply` cleaned them, and every start and every driver's keeper read every registry. A start on
    any stream now cleans one such registry."""
    cluster(3)
    start_job(store, "killed-job", "scratch", driver="gone-driver")
    with LedgerClient(metadata_uri) as lc:
        entry = register_task_ledger(store, job_registry("killed-job"))
        with create_task_ledger(lc, entry, ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"") as ledger:
            ledger.append(b"rows of the killed job")
        janitor.clean_stream(lc, "mine", b"")
        assert "killed-job" not in job_ids(store)
        assert ledger.ledger_id not in lc.list_ledgers()


def test_an_abandoned_registry_of_open_ledgers_under_another_password_is_left_as_it_is(store, metadata_uri, cluster):
    """Review 2026-11-29: a start cleaning another stream's abandoned registry with its own password fenced it and
    recorded it aborted, then failed at its OPEN ledgers, whose recovery takes their password: it is left untouched
    for `ledger jobs --apply --password` (closed ledgers are deleted without one)."""
    cluster(3)
    start_job(store, "killed-job", "secret-scratch", driver="gone-driver")
    with LedgerClient(metadata_uri) as lc, LedgerClient(metadata_uri) as task:
        entry = register_task_ledger(store, job_registry("killed-job"))
        ledger = create_task_ledger(task, entry, ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"secret")
        ledger.append(b"rows of the killed job")          # left OPEN: the task died
        before = store.read(job_registry("killed-job").path, bytes)
        janitor.clean_stream(lc, "mine", b"")
        assert store.read(job_registry("killed-job").path, bytes) == before      # not fenced, not stamped
        assert not lc.ledger_metadata(ledger.ledger_id).is_closed


def test_a_task_registering_while_a_stopped_query_is_removed_keeps_its_run(store, metadata_uri, monkeypatch):
    """The janitor looked (no entry, its driver gone), then a task of the query registered a ledger, then the janitor
    removed the runs one by one and the registry (not empty) stayed: an entry and no run, which no janitor cleans but
    `ledger jobs --apply --legacy` (session-expiry audit, 2026-11-29). Now the runs and the registry go in one multi, or
    nothing does, and the registry still names the gone driver, so the next janitor cleans it."""
    start_query(store, "q", "other", driver="gone-driver")
    [found] = [f for f in janitor.find_registries(store) if f.owner == "q"]
    real, entries = registry.writer_alive, []

    def writer_alive(store_, writer_id, watch=None):
        if writer_id == "gone-driver" and not entries:      # meanwhile: a task of the (paused) driver registers
            entries.append(register_task_ledger(store, query_registry("q", 3)))
        return real(store_, writer_id, watch)

    monkeypatch.setattr(registry, "writer_alive", writer_alive)
    assert not janitor.remove_stopped_query(store, found)
    monkeypatch.setattr(registry, "writer_alive", real)
    [left] = [f for f in janitor.find_registries(store) if f.owner == "q"]
    assert entries and left.state == janitor.ABANDONED and set(left.runs) == {"gone-driver"}
