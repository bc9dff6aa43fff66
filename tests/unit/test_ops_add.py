"""The add state machine: AQ acks from the write set, in-order LAC and completion, fencing, and the
bookkeeping of an ensemble change (rules 2 and 3)."""
import itertools

import pytest
from hypothesis import given, strategies as st

from connector.client.errors import EntryRefusedError, LedgerFencedError, UnauthorizedError
from connector.client.ops.add import AddSequence
from connector.client.schedule import Schedule
from protos import ledger_pb2 as pb
from protos.digest import entry_digest

ENSEMBLE = ("a", "b", "c")


def sequence(e=3, wq=3, aq=2, ensemble=ENSEMBLE):
    return AddSequence(7, Schedule(e, wq, aq), ensemble)


def test_append_targets_the_write_set_and_piggybacks_the_lac():
    seq = sequence(4, 2, 2, ("a", "b", "c", "d"))
    first, targets = seq.append(b"x")
    assert (first.entry_id, targets, first.last_add_confirmed) == (0, ("a", "b"), -1)
    assert first.digest == entry_digest(7, 0, -1, b"x")
    seq.on_result("a", 0, pb.OK)
    seq.on_result("b", 0, pb.OK)
    second, targets = seq.append(b"y")
    assert (second.entry_id, targets, second.last_add_confirmed) == (1, ("b", "c"), 0)


def test_a_recovery_write_back_piggybacks_the_lac_it_started_from_however_far_it_has_written_back():
    """A concurrent recovery may close the ledger below what this one writes back: a node must not learn a LAC
    above the recovery's start from it (rules 12, 17)."""
    seq = AddSequence(7, Schedule(3, 3, 2), ENSEMBLE, last_add_confirmed=4, recovery=True)
    for entry_id in (5, 6, 7):
        add, _ = seq.append(b"e%d" % entry_id)
        assert (add.entry_id, add.last_add_confirmed) == (entry_id, 4)
        assert add.digest == entry_digest(7, entry_id, 4, b"e%d" % entry_id)
        assert [done.entry_id for n in ("a", "b") for done in seq.on_result(n, entry_id, pb.OK)] == [entry_id]
    assert seq.last_add_confirmed == 7
    assert [add.last_add_confirmed for add in seq.append_many([b"e8", b"e9"])] == [4, 4]


@pytest.mark.parametrize("e, wq", [(3, 3), (4, 2), (5, 3)])
def test_append_many_makes_the_adds_that_appending_one_by_one_makes(e, wq):
    ensemble = tuple("abcde"[:e])
    one_by_one, batched = sequence(e, wq, 2, ensemble), sequence(e, wq, 2, ensemble)
    singles = [one_by_one.append(bytes([i]), now=5.0)[0] for i in range(7)]
    many = batched.append_many([bytes([i]) for i in range(7)], now=5.0)
    assert many == singles and batched.next_entry_id == one_by_one.next_entry_id == 7
    assert list(batched.pending) == list(range(7))
    assert batched.common_targets() == (ensemble if e == wq else None)


def test_targets_leave_out_failed_nodes_and_no_targets_are_common_meanwhile():
    seq = sequence()
    adds = seq.append_many([b"x", b"y"])
    assert seq.common_targets() == ENSEMBLE and seq.targets(adds[1]) == ("b", "c", "a")
    seq.on_node_failure("b")
    assert seq.common_targets() is None and seq.targets(adds[1]) == ("c", "a")
    assert seq.append(b"z") == (seq.pending[2], ("c", "a"))


def test_append_many_on_a_failed_ledger_appends_nothing():
    seq = sequence()
    seq.append(b"x")
    seq.on_result("a", 0, pb.FENCED)
    with pytest.raises(LedgerFencedError):
        seq.append_many([b"y", b"z"])
    assert seq.next_entry_id == 1


def test_ack_quorum_completes_and_acks_outside_the_write_set_do_not_count():
    seq = sequence(4, 2, 2, ("a", "b", "c", "d"))
    seq.append(b"x")
    assert seq.on_result("c", 0, pb.OK) == []
    assert seq.on_result("a", 0, pb.OK) == []
    assert [a.entry_id for a in seq.on_result("b", 0, pb.OK)] == [0]
    assert seq.last_add_confirmed == 0 and seq.length == 1


@pytest.mark.parametrize("order", list(itertools.permutations([(0, "a"), (0, "b"), (1, "b"), (1, "c"), (2, "a"),
                                                               (2, "c")])))
def test_completion_is_in_entry_order_whatever_order_acks_arrive(order):
    seq = sequence()
    for _ in range(3):
        seq.append(b"p")
    completed = []
    for entry_id, node in order:
        before = seq.last_add_confirmed
        completed += [a.entry_id for a in seq.on_result(node, entry_id, pb.OK)]
        assert seq.last_add_confirmed >= before
    assert completed == [0, 1, 2]


@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(ENSEMBLE)), max_size=40))
def test_lac_never_passes_an_entry_with_fewer_than_aq_acks(acks):
    seq = sequence()
    adds = [seq.append(b"p")[0] for _ in range(6)]
    acked = {i: set() for i in range(6)}
    completed = []
    for entry_id, node in acks:
        acked[entry_id].add(node)
        completed += [a.entry_id for a in seq.on_result(node, entry_id, pb.OK)]
        for e in range(seq.last_add_confirmed + 1):
            assert len(acked[e]) >= 2
    assert completed == list(range(seq.last_add_confirmed + 1))
    assert len(adds) == 6


def test_fenced_answer_fails_that_and_every_later_add():
    seq = sequence()
    seq.append(b"p")
    seq.append(b"q")
    assert seq.on_result("a", 1, pb.FENCED) == []
    assert isinstance(seq.error, LedgerFencedError)
    assert "is fenced: another client recovered it; an entry not acknowledged" in str(seq.error)
    assert not seq.pending
    with pytest.raises(LedgerFencedError):
        seq.append(b"r")


def test_unauthorized_answer_is_fatal():
    seq = sequence()
    seq.append(b"p")
    seq.on_result("b", 0, pb.UNAUTHORIZED)
    assert isinstance(seq.error, UnauthorizedError)


def test_an_entry_a_node_refuses_as_too_large_fails_the_writer_and_replaces_no_node():
    """Replacing nodes for an entry over their --max-entry-bytes would only walk the writer through every node
    with that limit (it did, as BAD_REQUEST, down to NotEnoughNodesError)."""
    seq = sequence()
    seq.append(b"p")
    seq.append(b"q")
    assert [a.entry_id for a in seq.on_result("a", 0, pb.OK) + seq.on_result("b", 0, pb.OK)] == [0]
    seq.on_result("c", 1, pb.TOO_LARGE, "entry of 9437184 bytes exceeds this node's limit of 8388608 bytes")
    assert seq.failed_nodes == set()
    assert isinstance(seq.error, EntryRefusedError)
    assert "node c refused entry 1 of ledger" in str(seq.error) and "exceeds this node's limit" in str(seq.error)
    assert seq.last_add_confirmed == 0
    with pytest.raises(EntryRefusedError):
        seq.append(b"r")


def test_a_recoverys_write_back_replaces_a_node_that_refuses_an_entry_as_too_large():
    """The entry was taken before, by nodes whose limit allows it: the write-back goes on elsewhere (rule 12)."""
    seq = AddSequence(7, Schedule(3, 3, 2), ("a", "b", "c"), recovery=True)
    seq.append(b"p")
    seq.on_result("c", 0, pb.TOO_LARGE, "entry of 9437184 bytes exceeds this node's limit of 8388608 bytes")
    assert seq.error is None and seq.failed_nodes == {"c"}


@pytest.mark.parametrize("status", [pb.ERROR, pb.READ_ONLY, pb.STATUS_UNKNOWN, pb.BAD_REQUEST])
def test_node_errors_hold_completion_until_the_node_is_replaced(status):
    seq = sequence()
    seq.append(b"p")
    seq.on_result("c", 0, status)
    assert seq.failed_nodes == {"c"}
    assert seq.on_result("a", 0, pb.OK) == [] and seq.on_result("b", 0, pb.OK) == []
    resends, completed = seq.replace_nodes(("a", "b", "d"))
    assert [(node, add.entry_id) for node, add in resends] == [("d", 0)]
    assert [a.entry_id for a in completed] == [0]


def test_ensemble_change_resends_only_unconfirmed_entries_of_the_failed_node_to_its_replacement():
    seq = sequence(4, 2, 2, ("a", "b", "c", "d"))
    for _ in range(4):
        seq.append(b"p")
    for entry_id, node in [(0, "a"), (0, "b"), (1, "b"), (2, "c"), (2, "d")]:
        seq.on_result(node, entry_id, pb.OK)
    assert seq.last_add_confirmed == 0
    seq.on_node_failure("c")  # entry 1 {b, c}, entry 2 {c, d} (acked by c), entry 3 {d, a}
    resends, completed = seq.replace_nodes(("a", "b", "e", "d"))
    assert sorted((n, a.entry_id) for n, a in resends) == [("e", 1), ("e", 2)]
    assert completed == []  # entry 2's ack from c no longer counts: the new fragment lists e instead
    assert seq.pending[2].write_set == ("e", "d") and seq.pending[2].acked == {"d"}
    assert [a.entry_id for a in seq.on_result("e", 1, pb.OK)] == [1]
    assert seq.on_result("c", 2, pb.OK) == []  # a late ack from the replaced node is ignored
    assert [a.entry_id for a in seq.on_result("e", 2, pb.OK)] == [2]


def test_appends_during_a_pending_change_skip_the_failed_node():
    seq = sequence()
    seq.on_node_failure("b")
    _, targets = seq.append(b"p")
    assert targets == ("a", "c")


def test_timed_out_nodes_are_those_that_did_not_ack_old_adds():
    seq = sequence()
    seq.append(b"p", now=0.0)
    seq.on_result("a", 0, pb.OK)
    seq.on_result("b", 0, pb.OK)
    seq.append(b"q", now=1.0)
    seq.on_result("a", 1, pb.OK)
    assert seq.timed_out_nodes(now=5.0, timeout=10.0) == set()
    assert seq.timed_out_nodes(now=12.0, timeout=10.0) == {"b", "c"}


def test_a_node_frozen_under_old_adds_times_out_though_an_earlier_add_was_resent_since():
    """Writer/recovery audit 2026-11-29: the scan stopped at the first add sent less than the timeout ago, but a
    resend (an ensemble change) makes an earlier add younger than those after it: a frozen node was found up
    to a whole timeout late, and the LAC stalled meanwhile."""
    seq = sequence(4, 2, 2, ("a", "b", "c", "d"))       # write sets: 0 ab, 1 bc, 2 cd
    for entry_id in range(3):
        seq.append(b"p", now=0.0)
    for node, entry_id in (("a", 0), ("b", 0), ("b", 1), ("d", 2)):
        seq.on_result(node, entry_id, pb.OK)         # c is frozen: entries 1 and 2 wait for it
    seq.on_node_failure("b")
    seq.replace_nodes(("a", "e", "c", "d"), now=9.0)  # entry 1 is resent to e at 9
    assert seq.timed_out_nodes(now=10.0, timeout=10.0) == {"c"}   # entry 2 has waited for c since 0


def test_a_node_frozen_under_a_resent_add_is_timed_from_when_it_was_sent_the_add():
    """Review 2026-11-29: a resend restarted the whole add's clock, so a node the add kept, silent since the first
    send, was found one timeout after the resend when no later add covered it; each node is timed from when it
    was sent the add."""
    seq = sequence()                                   # E=3 WQ=3 AQ=2 over a, b, c
    seq.append(b"p", now=0.0)
    seq.on_result("a", 0, pb.OK)                        # b is frozen; c fails
    seq.on_node_failure("c")
    seq.replace_nodes(("a", "b", "d"), now=9.0)         # resent to d at 9
    assert seq.timed_out_nodes(now=10.0, timeout=10.0) == {"b"}
    assert seq.timed_out_nodes(now=18.0, timeout=10.0) == {"b"}     # d, sent it at 9, has time until 19
    assert seq.timed_out_nodes(now=19.0, timeout=10.0) == {"b", "d"}


def test_idle_writer_sends_the_lac_to_every_node_that_does_not_hold_it_until_each_does():
    seq = sequence()
    seq.append(b"p")
    assert seq.lac_targets() == []  # an add is pending: it will carry the LAC
    seq.on_result("a", 0, pb.OK)
    seq.on_result("b", 0, pb.OK)
    assert seq.lac_targets() == ["a", "b", "c"]  # entry 0 carried LAC -1
    seq.on_lac_written("a", 0)
    assert seq.lac_targets() == ["b", "c"]  # b's answer was lost: asked again
    seq.on_lac_written("b", 0)
    seq.on_lac_written("c", 0)
    assert seq.lac_targets() == []


def test_an_acknowledged_add_tells_that_its_node_holds_the_lac_it_carried():
    seq = sequence()
    for entry_id in range(2):
        seq.append(b"p")
        for node in ("a", "b", "c"):
            seq.on_result(node, entry_id, pb.OK)
    # c's answers came after each add completed: too late to count, so c is asked explicitly too
    assert seq.node_lac == {"a": 0, "b": 0}
    assert seq.lac_targets() == ["a", "b", "c"]  # the LAC is 1 now


def test_recovery_write_back_continues_after_the_recovered_lac_with_the_recovery_flag():
    seq = AddSequence(7, Schedule(3, 3, 2), ENSEMBLE, last_add_confirmed=41, recovery=True)
    add, _ = seq.append(b"p")
    assert add.entry_id == 42 and seq.flags == pb.RECOVERY_ADD
