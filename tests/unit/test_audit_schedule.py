"""The auditor's schedule (connector/client/replication.py AuditSchedule): a round reads every ledger only when the
nodes changed since the last scan, or once the periodic check is due (a ledger a scan could not repair is looked at
again alone: tests/integration/test_replication_audit.py)."""
from connector.client.replication import AuditSchedule

NODES = (frozenset({("node-1", 11), ("node-2", 12), ("node-3", 13)}), frozenset())


def test_a_round_scans_only_when_something_could_have_become_under_replicated():
    schedule = AuditSchedule(full_seconds=3600)
    assert schedule.reason(NODES, 0.0) == "the first round"
    schedule.scanned(NODES, 0.0)
    assert schedule.reason(NODES, 30.0) is None
    assert schedule.next_full_scan(30.0) == 3570.0
    gone = (frozenset({("node-1", 11), ("node-2", 12)}), frozenset())
    restarted = (frozenset({("node-1", 11), ("node-2", 12), ("node-3", 99)}), frozenset())
    retired = (NODES[0], frozenset({"node-2"}))
    for nodes in (gone, restarted, retired):
        assert schedule.reason(nodes, 60.0) == "the nodes changed"
    schedule.scanned(gone, 90.0)
    assert schedule.reason(gone, 3689.0) is None
    assert schedule.reason(gone, 3690.0) == "the periodic check of every ledger"
