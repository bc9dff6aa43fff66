"""Re-replication planning: which fragments are under-replicated, which entries go where, reads with failover,
write acknowledgements and the metadata transform."""
import pytest

from connector.client.errors import NotEnoughNodesError
from connector.client.replication import (
    CopyReads,
    CopyWrites,
    EntryCopy,
    ReplicaWriteError,
    ReplicationConflictError,
    ReplicationError,
    choose_replacements,
    fragments_to_repair,
    lost_nodes,
    plan_copies,
    replace_in_fragment,
)
from connector.client.schedule import Schedule
from metadata.model import Fragment, LedgerMetadata, LedgerState, NodeRegistration, NodeState, over_replicated_on
from protos import ledger_pb2 as pb
from protos.digest import entry_digest


def ledger(e, wq, fragments, last=-1, state=LedgerState.CLOSED):
    return LedgerMetadata(7, e, wq, 2, tuple(Fragment(first, tuple(ens)) for first, ens in fragments),
                          state=state, last_entry_id=last)


def nodes(*ids, read_only=()):
    return {n: NodeRegistration(n, f"127.0.0.1:{i}", NodeState.READ_ONLY if n in read_only else NodeState.AVAILABLE)
            for i, n in enumerate(ids)}


def response(entry_id, payload=b"p", corrupt=False, status=pb.OK, lac=-1):
    return pb.ReadResponse(status=status, ledger_id=7, entry_id=entry_id, last_add_confirmed=lac, payload=payload,
                           digest=entry_digest(7, entry_id, lac, payload) ^ int(corrupt))


def test_lost_nodes_are_the_unregistered_and_the_decommissioned():
    assert lost_nodes("abcd", registered="abd", decommissioned="d") == {
        "c": "gone (not registered)", "d": "decommissioned"}
    assert lost_nodes("ab", registered="ab", decommissioned="") == {}
    # auditor audit 2026-11-29: a broken node stays registered but serves nothing until restarted
    assert lost_nodes("abc", registered="abc", decommissioned="", broken="b") == {
        "b": "broken (it serves nothing until restarted)"}


def test_only_fragments_holding_a_lost_node_are_repaired_with_their_ranges():
    meta = ledger(3, 2, [(0, "abc"), (10, "abd"), (20, "dbe")], last=24)
    repairs = fragments_to_repair(meta, {"a"})
    assert [(r.first_entry_id, r.last_entry_id, r.lost) for r in repairs] == [(0, 9, ("a",)), (10, 19, ("a",))]
    assert [(r.first_entry_id, r.last_entry_id) for r in fragments_to_repair(meta, {"d", "e"})] == [(10, 19), (20, 24)]
    assert fragments_to_repair(meta, {"x"}) == []


def test_open_ledgers_last_fragment_is_open_ended_and_cannot_be_copied():
    meta = ledger(3, 3, [(0, "abc")], state=LedgerState.OPEN)
    [repair] = fragments_to_repair(meta, {"b"})
    assert not repair.closed and repair.describe() == "entries 0..open on [a, b, c]"
    with pytest.raises(ReplicationError, match="recover it"):
        plan_copies(repair, Schedule(3, 3, 2), ("a", "x", "c"))


def test_an_open_ledgers_fragments_before_its_last_are_closed_and_copied_without_closing_it():
    """An ensemble change ends a fragment at the writer's LAC: its entries were acknowledged and no add goes to it
    any more, so it is repaired as in a closed ledger while the writer goes on (BookKeeper re-replicates such
    fragments of open ledgers without fencing them)."""
    meta = ledger(3, 3, [(0, "abc"), (10, "abd")], state=LedgerState.OPEN)
    [first, last] = fragments_to_repair(meta, {"a"})
    assert (first.closed, first.first_entry_id, first.last_entry_id) == (True, 0, 9) and not last.closed
    assert [c.entry_id for c in plan_copies(first, Schedule(3, 3, 2), ("x", "b", "c"))] == list(range(10))
    replaced = replace_in_fragment(first, ("x", "b", "c"))(meta)
    assert replaced.fragments == (Fragment(0, ("x", "b", "c")), Fragment(10, ("a", "b", "d")))
    assert replaced.state is LedgerState.OPEN
    with pytest.raises(ReplicationError, match="recover it"):
        plan_copies(last, Schedule(3, 3, 2), ("x", "b", "d"))
    # The writer changed its ensemble again meanwhile: the fragment planned is still the same, still copyable.
    changed = meta.replace(fragments=meta.fragments + (Fragment(15, ("e", "b", "d")),))
    assert replace_in_fragment(first, ("x", "b", "c"))(changed).fragments[0] == Fragment(0, ("x", "b", "c"))
    with pytest.raises(ReplicationConflictError):   # the planned range 0..9 is not the stored one
        replace_in_fragment(first, ("x", "b", "c"))(meta.replace(fragments=(Fragment(0, ("a", "b", "c")),
                                                                            Fragment(12, ("a", "b", "d")))))


def test_a_fragment_starting_past_the_closed_end_has_nothing_to_copy():
    meta = ledger(3, 3, [(0, "abc"), (5, "abd")], last=4)  # an ensemble change right before the close
    [repair] = fragments_to_repair(meta, {"d"})
    assert (repair.first_entry_id, repair.last_entry_id) == (5, 4)
    assert plan_copies(repair, Schedule(3, 3, 2), ("a", "b", "x")) == []
    assert replace_in_fragment(repair, ("a", "b", "x"))(meta).fragments[1] == Fragment(5, ("a", "b", "x"))


def test_full_replication_copies_every_entry_from_the_other_replicas_first():
    meta = ledger(3, 3, [(0, "abc")], last=3)
    [repair] = fragments_to_repair(meta, {"b"})
    copies = plan_copies(repair, Schedule(3, 3, 2), ("a", "x", "c"))
    assert [c.entry_id for c in copies] == [0, 1, 2, 3]
    assert all(c.targets == ("x",) for c in copies)
    # write set order of the surviving replicas, the lost node last as a fallback
    assert copies[0].sources == ("a", "c", "b") and copies[1].sources == ("c", "a", "b")


def test_striped_ensemble_copies_only_the_lost_nodes_entries():
    # E=3 WQ=2: entry e lives on positions e%3 and (e+1)%3; b is position 1: entries 0, 1, 3, 4, 6
    meta = ledger(3, 2, [(0, "abc")], last=6)
    [repair] = fragments_to_repair(meta, {"b"})
    copies = plan_copies(repair, Schedule(3, 2, 2), ("a", "x", "c"))
    assert [(c.entry_id, c.sources, c.targets) for c in copies] == [
        (0, ("a", "b"), ("x",)), (1, ("c", "b"), ("x",)), (3, ("a", "b"), ("x",)),
        (4, ("c", "b"), ("x",)), (6, ("a", "b"), ("x",))]


def test_multiple_fragments_and_two_lost_nodes_in_one_fragment():
    meta = ledger(4, 2, [(0, "abcd"), (4, "abce")], last=7)
    first, second = fragments_to_repair(meta, {"b", "c"})
    copies = plan_copies(first, Schedule(4, 2, 2), ("a", "x", "y", "d"))
    # entry 1 has write set (b, c): both replicas lost, both replaced, read from either old one
    assert {c.entry_id: c.targets for c in copies} == {0: ("x",), 1: ("x", "y"), 2: ("y",)}
    assert [c.sources for c in copies if c.entry_id == 1] == [("b", "c")]
    assert [c.entry_id for c in plan_copies(second, Schedule(4, 2, 2), ("a", "x", "y", "e"))] == [4, 5, 6]


def test_replacements_come_from_writable_nodes_outside_the_ensemble():
    meta = ledger(3, 3, [(0, "abc")], last=0)
    [repair] = fragments_to_repair(meta, {"b"})
    assert choose_replacements(repair, nodes("a", "b", "c", "d", "e", read_only="e")) == ("a", "d", "c")
    assert choose_replacements(repair, nodes("a", "c", "d", "e"), exclude={"d"}) == ("a", "e", "c")
    with pytest.raises(NotEnoughNodesError):
        choose_replacements(repair, nodes("a", "b", "c"))


def test_metadata_transform_replaces_the_node_in_that_fragment_only():
    meta = ledger(3, 3, [(0, "abc"), (5, "abd")], last=9)
    repair = fragments_to_repair(meta, {"b"})[1]
    updated = replace_in_fragment(repair, ("a", "x", "d"))(meta)
    assert updated.fragments == (Fragment(0, ("a", "b", "c")), Fragment(5, ("a", "x", "d")))
    assert updated.last_entry_id == 9 and updated.state is LedgerState.CLOSED
    assert replace_in_fragment(repair, ("a", "x", "d"))(updated) is None  # stored already: nothing to do


@pytest.mark.parametrize("changed", [
    ledger(3, 3, [(0, "abc"), (5, "aed")], last=9),          # another repairer moved it elsewhere
    ledger(3, 3, [(0, "abc"), (6, "abd")], last=9),          # fragment boundaries differ
    ledger(3, 3, [(0, "abc"), (5, "abd")], last=12),         # the ledger's end differs
    ledger(3, 3, [(0, "abc"), (5, "abd")], state=LedgerState.IN_RECOVERY),
])
def test_metadata_transform_refuses_a_fragment_that_changed_since_planning(changed):
    repair = fragments_to_repair(ledger(3, 3, [(0, "abc"), (5, "abd")], last=9), {"b"})[1]
    with pytest.raises(ReplicationConflictError, match="planning again"):
        replace_in_fragment(repair, ("a", "x", "d"))(changed)


def test_reads_fail_over_entry_by_entry_and_keep_lac_and_digest():
    copies = [EntryCopy(0, ("a", "c", "b"), ("x",)), EntryCopy(1, ("c", "a", "b"), ("x",)),
              EntryCopy(2, ("a", "c", "b"), ("x",))]
    reads = CopyReads(7, copies)
    calls = reads.calls()
    assert [(c.node, c.first_entry_id, c.last_entry_id) for c in calls] == [("a", 0, 2), ("c", 1, 1)]
    reads.on_entry("a", response(0, b"zero", lac=-1))
    reads.on_entry("a", response(2, b"two", corrupt=True))       # damaged copy: read it elsewhere
    reads.on_call_done(calls[0])
    reads.on_call_done(calls[1], "UNAVAILABLE")                 # c is down: entry 1 moves on to a
    assert [(c.node, c.first_entry_id, c.last_entry_id) for c in reads.calls()] == [("a", 1, 1), ("c", 2, 2)]
    reads.on_entry("a", response(1, b"one", lac=0))
    reads.on_entry("c", response(2, b"two", lac=1))
    for call in reads.calls():
        reads.on_call_done(call)
    assert reads.done and reads.error() is None
    assert {e: (r.payload, r.last_add_confirmed) for e, r in reads.entries.items()} == {
        0: (b"zero", -1), 1: (b"one", 0), 2: (b"two", 1)}
    assert reads.entries[1].digest == entry_digest(7, 1, 0, b"one")


def test_an_entry_no_replica_supplies_stops_the_copy():
    reads = CopyReads(7, [EntryCopy(3, ("a", "b"), ("x",))])
    for node in ("a", "b"):
        [call] = reads.calls()
        assert call.node == node
        if node == "a":
            reads.on_entry(node, response(3, status=pb.ERROR))  # has it, cannot read it: unknown, not absent
        reads.on_call_done(call)
    assert reads.done
    error = reads.error()
    assert isinstance(error, ReplicationError)
    assert "entry 3 of ledger 7" in str(error) and "a: ERROR" in str(error) and "b: not returned" in str(error)


def test_writes_complete_at_every_ack_and_fail_on_a_replacement_error():
    copies = [EntryCopy(0, ("a",), ("x", "y")), EntryCopy(1, ("a",), ("x",))]
    writes = CopyWrites(7, copies)
    writes.on_result("x", 0, pb.OK)
    writes.on_result("z", 0, pb.OK)   # not a target: ignored
    assert not writes.done
    writes.on_result("y", 0, pb.OK)
    writes.on_result("x", 1, pb.OK)
    assert writes.done and writes.failure is None

    failing = CopyWrites(7, copies)
    failing.on_result("x", 0, pb.OK)
    failing.on_result("y", 0, pb.READ_ONLY, "disk full")
    assert failing.done and isinstance(failing.failure, ReplicaWriteError) and failing.failure.node == "y"
    assert "READ_ONLY disk full" in str(failing.failure)


def test_a_repair_stores_its_copies_only_while_no_node_dropped_copies_since_it_was_planned():
    """A node drops its copies of a CLOSED ledger that names it nowhere, after advancing copy_drops
    (storage_node/gc.py); copies a repair made to that node before the metadata named it are such copies. The
    repair's CAS is refused then, also when its update loop re-reads a record whose fragments are as planned."""
    meta = ledger(3, 3, [(0, "abc")], last=9)
    [repair] = fragments_to_repair(meta, {"b"})
    assert repair.copy_drops == 0
    dropped = meta.with_copies_dropped()
    assert dropped.copy_drops == 1 and dropped.fragments == meta.fragments
    with pytest.raises(ReplicationConflictError, match="dropped copies"):
        replace_in_fragment(repair, ("a", "x", "c"))(dropped)
    [replanned] = fragments_to_repair(dropped, {"b"})
    updated = replace_in_fragment(replanned, ("a", "x", "c"))(dropped)
    assert updated.fragments == (Fragment(0, ("a", "x", "c")),) and updated.copy_drops == 1
    # Stored already (another repair, planned after the drop, named the same node): nothing to do.
    assert replace_in_fragment(repair, ("a", "x", "c"))(updated) is None


@pytest.mark.parametrize("meta, garbage", [
    (ledger(3, 3, [(0, "abc")], last=9), True),                         # moved off "d" (or never on it)
    (ledger(3, 3, [(0, "abd"), (5, "abc")], last=9), False),            # an earlier fragment names it
    (ledger(3, 3, [(0, "abc"), (10, "abd")], last=9), False),           # one that starts past the end too
    (ledger(3, 3, [(0, "abc")], state=LedgerState.OPEN), False),        # a writer may still change ensemble
    (ledger(3, 3, [(0, "abc")], state=LedgerState.IN_RECOVERY), False),  # a recovery's close may name it
])
def test_a_nodes_copies_are_garbage_only_in_a_closed_ledger_that_names_it_in_no_fragment(meta, garbage):
    assert over_replicated_on(meta, "d") is garbage
