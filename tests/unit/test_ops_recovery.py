"""Recovery decisions (rules 10-13) fed replies in every order: fencing to coverage, positive on one verified
reply, negative only at (WQ - AQ) + 1 negatives from the write set, anything else aborts."""
import itertools

import pytest

from connector.client.errors import RecoveryIncompleteError, UnauthorizedError
from connector.client.ops.read import RangeCall
from connector.client.ops.read_lac import ReadLacOp
from connector.client.ops.recovery import RecoveryReadOp, begin_recovery, recovery_start
from connector.client.schedule import Schedule
from metadata.model import Fragment, LedgerMetadata, LedgerState
from protos import ledger_pb2 as pb
from protos.digest import entry_digest

ENSEMBLE = ("a", "b", "c")


def entry(entry_id, payload=b"p", lac=0, ledger_id=7, corrupt=False):
    digest = entry_digest(ledger_id, entry_id, lac, payload) ^ (1 if corrupt else 0)
    return pb.ReadResponse(status=pb.OK, ledger_id=ledger_id, entry_id=entry_id, last_add_confirmed=lac,
                           payload=payload, digest=digest)


# -- fencing LAC read ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("order", list(itertools.permutations(["a", "b", "c"])))
def test_fencing_is_done_at_coverage_whatever_the_order(order):
    op = ReadLacOp(7, Schedule(3, 3, 2), ENSEMBLE, fence=True)
    lacs = {"a": 4, "b": 9, "c": 6}
    op.on_response(order[0], pb.OK, last_add_confirmed=lacs[order[0]])
    assert not op.done
    op.on_response(order[1], pb.NO_LEDGER)  # a node that never saw the ledger is fenced by the request
    assert op.done and op.outcome() == lacs[order[0]]


def test_fencing_with_too_many_unknowns_is_incomplete():
    op = ReadLacOp(7, Schedule(3, 3, 2), ENSEMBLE, fence=True)
    op.on_response("a", pb.OK, last_add_confirmed=3)
    op.on_failure("b", "deadline exceeded")
    assert not op.done
    op.on_response("c", pb.ERROR)
    assert op.done
    with pytest.raises(RecoveryIncompleteError, match="nothing was closed"):
        op.outcome()


def test_fencing_refused_for_the_password_reports_unauthorized():
    op = ReadLacOp(7, Schedule(3, 3, 2), ENSEMBLE, fence=True)
    for node in ENSEMBLE:
        op.on_response(node, pb.UNAUTHORIZED)
    with pytest.raises(UnauthorizedError, match="password"):
        op.outcome()


def test_striped_fencing_needs_one_node_in_every_window():
    op = ReadLacOp(7, Schedule(4, 2, 2), ("a", "b", "c", "d"), fence=True)
    op.on_response("a", pb.OK)
    op.on_response("b", pb.OK)
    assert not op.covered
    op.on_response("c", pb.OK)
    assert op.covered


# -- where recovery starts -------------------------------------------------------------------------------------

def meta(fragments, state=LedgerState.OPEN):
    return LedgerMetadata(7, 3, 3, 2, tuple(Fragment(f, ENSEMBLE) for f in fragments), state=state)


def test_recovery_starts_at_the_highest_lac_or_before_the_last_fragment():
    assert recovery_start(meta([0]), 41) == 41
    assert recovery_start(meta([0, 50]), 41) == 49


def test_begin_recovery_moves_only_an_open_ledger():
    assert begin_recovery(meta([0])).state is LedgerState.IN_RECOVERY
    assert begin_recovery(meta([0], LedgerState.IN_RECOVERY)) is None
    assert begin_recovery(meta([0], LedgerState.CLOSED)) is None


# -- recovery reads --------------------------------------------------------------------------------------------

def reads(e=3, wq=3, aq=2, ensemble=ENSEMBLE, start=9, window=4):
    op = RecoveryReadOp(7, Schedule(e, wq, aq), ensemble, start, first_window=window, windows_in_flight=1)
    calls = op.requests()
    return op, calls


def test_windows_go_to_every_node_of_the_fragment():
    op, calls = reads()
    assert calls == [RangeCall(n, 10, 13) for n in ENSEMBLE]


def replies_for_two_entries_then_end():
    """a holds 10 and 11, b holds 10, c holds nothing. 10 (on two nodes, maybe acknowledged) must be recovered;
    11 (on one node, never acknowledged at AQ=2) may or may not be, depending on which answers come first."""
    return [("entry", "a", 10), ("entry", "a", 11), ("entry", "b", 10), ("done", "a"), ("done", "b"), ("done", "c")]


def stream_consistent(order):
    """Each node's own stream is in order (entries, then its end); streams interleave freely."""
    events = replies_for_two_entries_then_end()
    return all([e for e in order if e[1] == node] == [e for e in events if e[1] == node] for node in ENSEMBLE)


@pytest.mark.parametrize("order", [o for o in itertools.permutations(replies_for_two_entries_then_end())
                                   if stream_consistent(o)])
def test_positive_on_one_reply_negative_at_threshold_in_every_order(order):
    op, calls = reads()
    by_node = {c.node: c for c in calls}
    for kind, node, *rest in order:
        if kind == "entry":
            op.on_entry(node, entry(rest[0]))
        else:
            op.on_range_done(by_node[node])
    assert op.end in (10, 11) and op.error is None
    assert op.take_recovered() == [(e, b"p") for e in range(10, op.end + 1)]


def test_one_negative_and_one_unknown_is_unknown_not_negative():
    op, calls = reads()
    op.on_range_done(calls[0])                      # a: nothing past 9
    op.on_range_done(calls[1], pb.ERROR, "I/O")     # b: unknown
    assert not op.done                              # c may still hold entry 10
    op.on_range_done(calls[2], reason="deadline exceeded", status=pb.STATUS_UNKNOWN)
    assert op.end is None and isinstance(op.error, RecoveryIncompleteError)


def test_a_corrupt_copy_is_unknown_and_a_good_copy_elsewhere_is_positive():
    op, calls = reads()
    op.on_entry("a", entry(10, corrupt=True))
    op.on_range_done(calls[0])
    op.on_range_done(calls[1])
    assert not op.done  # a's bad copy is unknown, b's negative is one of the two needed
    op.on_range_done(calls[2], pb.ERROR)
    assert isinstance(op.error, RecoveryIncompleteError)
    op, calls = reads()
    op.on_entry("a", entry(10, corrupt=True))
    op.on_entry("b", entry(10))
    op.on_range_done(calls[0])
    op.on_range_done(calls[1])
    op.on_range_done(calls[2])
    assert op.end == 10


def test_error_row_is_unknown():
    op, calls = reads()
    op.on_entry("a", pb.ReadResponse(status=pb.ERROR, entry_id=10))
    op.on_range_done(calls[0])
    op.on_range_done(calls[1])
    assert not op.done
    op.on_range_done(calls[2], pb.STATUS_UNKNOWN, "deadline exceeded")
    assert op.end is None and "cannot decide entry 10" in str(op.error)


def test_nothing_after_the_lac_closes_at_the_lac():
    op, calls = reads()
    op.on_range_done(calls[1], pb.NO_LEDGER)
    op.on_range_done(calls[2])
    assert op.end == 9 and op.take_recovered() == []


@pytest.mark.parametrize("wq, aq", [(2, 1), (2, 2), (3, 1), (3, 2), (3, 3), (4, 2), (4, 3), (4, 4)])
def test_negatives_required_follow_the_threshold(wq, aq):
    nodes = tuple("abcd"[:wq])
    op, calls = reads(wq, wq, aq, nodes)
    threshold = wq - aq + 1
    for call in calls[:threshold - 1]:
        op.on_range_done(call)
    assert op.end is None
    op.on_range_done(calls[threshold - 1])
    assert op.end == 9


def test_aq_one_with_a_node_down_stalls_instead_of_truncating():
    op, calls = reads(3, 3, 1)
    op.on_range_done(calls[0])
    op.on_range_done(calls[1])
    op.on_range_done(calls[2], pb.STATUS_UNKNOWN, "unavailable")
    assert op.end is None and isinstance(op.error, RecoveryIncompleteError)


def test_negatives_count_only_from_the_entry_write_set():
    op, calls = reads(4, 2, 2, ("a", "b", "c", "d"), start=-1)  # entry 0 lives on a, b
    op.on_range_done(calls[2])
    op.on_range_done(calls[3])
    assert op.end is None
    op.on_range_done(calls[0])
    assert op.end == -1


def test_reads_are_pipelined_in_growing_windows_until_the_end():
    op = RecoveryReadOp(7, Schedule(3, 3, 2), ENSEMBLE, -1, first_window=2, windows_in_flight=2)
    calls = op.requests()
    assert {(c.first_entry_id, c.last_entry_id) for c in calls} == {(0, 1), (2, 5)}
    for e in range(6):
        op.on_entry("a", entry(e))
    assert op.decided == 5 and len(op.take_recovered()) == 6
    more = op.requests()
    assert {(c.first_entry_id, c.last_entry_id) for c in more} == {(6, 13), (14, 29)}
    for call in more:
        op.on_range_done(call)
    assert op.end == 5 and op.requests() == []
