"""The auditor's schedule (connector/client/replication.py AuditSchedule): a round reads every ledger only when the
nodes changed since the last scan, or once the periodic check is due (a ledger a scan could not repair is looked at
again alone: tests/integration/test_replication_audit.py)."""
from connector.client.replication import Absences, AuditSchedule

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


def test_an_unregistered_node_is_excused_until_it_has_been_away_for_the_grace():
    absences = Absences(grace=60.0, now=0.0)
    absences.update({"a", "b"}, now=0.0)
    absences.update({"a"}, now=10.0)                      # b leaves at 10
    assert absences.excused("b", now=69.0) and not absences.excused("b", now=70.0)
    assert not absences.excused("a", now=69.0)            # registered: nothing to excuse
    assert absences.excused("never-seen", now=59.0) and not absences.excused("never-seen", now=60.0)
    assert absences.expired(59.0) == frozenset() and absences.expired(60.0) == {"*"}
    assert absences.expired(70.0) == {"*", "b"}           # a change of the nodes: the auditor scans then
    absences.update({"a", "b"}, now=71.0)                 # b is back: its absence ends
    absences.update({"a"}, now=80.0)
    assert absences.excused("b", now=139.0) and absences.expired(139.0) == {"*"}
    assert not Absences(grace=0.0, now=0.0).excused("b", now=0.0)
