"""A streaming query that stops leaves its registry behind: its runs, which name its driver (each batch's task
entries are swept as it commits). Nothing removed them while no job started on their stream, and every driver's
keeper reads every registry every 10 s, so a cluster where queries come and go paid for every query it ever ran.
A job's or query's start now removes up to 16 of them on other streams: those whose
drivers are gone and that hold no task entries. Real ZooKeeper, the real janitor."""
from __future__ import annotations

from connector.client import LedgerClient
from connector.spark import janitor
from connector.spark.jobs import query_ids, query_registry, register_task_ledger, start_query
from metadata import registry


def test_a_start_removes_what_stopped_queries_left_on_other_streams_and_nothing_else(store, metadata_uri):
    stopped = [f"stopped-{i}" for i in range(janitor.STOPPED_QUERIES_PER_START + 3)]
    for i, query in enumerate(stopped):
        start_query(store, query, "other", driver=f"gone-{i}")
    start_query(store, "with-a-task-ledger", "other", driver="gone-too")
    register_task_ledger(store, query_registry("with-a-task-ledger", 7))   # its stream's own start cleans it
    live = registry.register_writer(store, "live-driver")
    start_query(store, "running", "other", driver="live-driver")
    kept = {"with-a-task-ledger", "running"}
    try:
        with LedgerClient(metadata_uri) as lc:
            janitor.clean_stream(lc, "mine", b"")
            left = set(query_ids(store)) - kept
            assert len(left) == 3 and left < set(stopped)      # at most STOPPED_QUERIES_PER_START a start
            janitor.clean_stream(lc, "mine", b"")
        assert set(query_ids(store)) == kept
    finally:
        live.close()


def test_registries_it_cannot_remove_do_not_take_every_starts_turn(store, metadata_uri):
    """Registries of queries whose drivers died with task ledgers left (their own stream's next start discards
    them) are looked at and left; they used to take up all of a start's turns when their ids sorted first."""
    for i in range(janitor.STOPPED_QUERIES_PER_START + 4):
        start_query(store, f"a-busy-{i:02}", "other", driver=f"gone-busy-{i}")
        register_task_ledger(store, query_registry(f"a-busy-{i:02}", 0))
    for i in range(3):
        start_query(store, f"z-stopped-{i}", "other", driver=f"gone-{i}")
    with LedgerClient(metadata_uri) as lc:
        janitor.clean_stream(lc, "mine", b"")
    assert not [q for q in query_ids(store) if q.startswith("z-stopped-")]
    assert len([q for q in query_ids(store) if q.startswith("a-busy-")]) == janitor.STOPPED_QUERIES_PER_START + 4
