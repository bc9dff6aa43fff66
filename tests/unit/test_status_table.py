"""The one status -> exception table (connector/client/errors.py), and the wording of the refusals a node
sends and a client raises, written once (protos/refusals.py)."""
import pytest

from connector.client.errors import (
    NEGATIVES,
    LedgerError,
    LedgerFencedError,
    NodeError,
    UnauthorizedError,
    answered,
    error_for_status,
    fenced_message,
    refuses_ledger,
    unauthorized_message,
)
from connector.client.ops.add import AddSequence
from connector.client.ops.read_lac import ReadLacOp
from connector.client.ops.recovery import RecoveryReadOp
from connector.client.schedule import Schedule
from protos import ledger_pb2 as pb
from storage_node.ledger_state import LedgerState

ENSEMBLE = ("a", "b", "c")


@pytest.mark.parametrize("status", [s for s in pb.Status.values() if s != pb.OK])
def test_every_status_but_ok_maps_to_an_error_naming_the_node_or_the_ledger(status):
    error = error_for_status(status, node="a", ledger=7, entry=3)
    assert isinstance(error, LedgerError) and ("node a" in str(error) or "ledger 7" in str(error))


def test_only_fenced_and_unauthorized_refuse_the_ledger_itself():
    assert {s for s in pb.Status.values() if refuses_ledger(s)} == {pb.FENCED, pb.UNAUTHORIZED}
    assert isinstance(error_for_status(pb.FENCED, node="a", ledger=7), LedgerFencedError)
    assert isinstance(error_for_status(pb.UNAUTHORIZED, node="a", ledger=7), UnauthorizedError)
    assert isinstance(error_for_status(pb.READ_ONLY, node="a", ledger=7), NodeError)


def test_a_nodes_answers_are_ok_and_the_negatives_and_any_other_status_is_its_failure():
    assert NEGATIVES == {pb.NO_LEDGER, pb.NO_ENTRY}
    assert {s for s in pb.Status.values() if answered(s)} == {pb.OK, *NEGATIVES}
    assert not answered(99)   # a status this client does not know (a newer node's)


@pytest.mark.parametrize("status", [*pb.Status.values(), 99])
def test_a_lac_read_and_a_recovery_read_take_the_same_statuses_for_answers(status):
    """One table (errors.answered) for every op that weighs a node's status; they each kept a list before."""
    lac = ReadLacOp(7, Schedule(3, 3, 2), ENSEMBLE, fence=False)
    lac.on_response("a", status)
    recovery = RecoveryReadOp(7, Schedule(3, 3, 2), ENSEMBLE, -1, first_window=1, windows_in_flight=1)
    (call, *_) = recovery.requests()
    recovery.on_range_done(call, status, "reason")
    assert (lac.answered == {0}) == ("a" in recovery.votes[0].negative) == answered(status)


def test_a_writer_raises_the_nodes_refusal_in_the_same_words_once():
    state = LedgerState(7, b"key", fenced=True)
    refusals = [state.check_add(b"other", recovery=False), state.check_add(b"key", recovery=False)]
    assert refusals == [(pb.UNAUTHORIZED, unauthorized_message(7)), (pb.FENCED, fenced_message(7))]
    assert state.check_fence(b"other") == (pb.UNAUTHORIZED, unauthorized_message(7))
    for (status, message), error_type in zip(refusals, (UnauthorizedError, LedgerFencedError)):
        seq = AddSequence(7, Schedule(3, 3, 2), ENSEMBLE)
        seq.append(b"p")
        seq.on_result("a", 0, status, message)
        assert type(seq.error) is error_type and str(seq.error) == message


def test_a_refused_explicit_lac_is_a_refusal_too():
    state = LedgerState(7, b"key", fenced=True)
    assert state.check_write_lac(b"key") == (pb.FENCED, fenced_message(7))


def test_fencing_refused_by_some_nodes_and_unreachable_on_the_others_is_unauthorized():
    op = ReadLacOp(7, Schedule(3, 3, 2), ENSEMBLE, fence=True)
    op.on_response("a", pb.UNAUTHORIZED, message=unauthorized_message(7))
    op.on_failure("b", "deadline exceeded")
    op.on_response("c", pb.OK, last_add_confirmed=4)
    assert op.done and not op.covered
    with pytest.raises(UnauthorizedError, match=r"wrong password for ledger 7; .*b: deadline exceeded"):
        op.outcome()


def test_fencing_covered_despite_a_refusal_returns_the_lac():
    op = ReadLacOp(7, Schedule(3, 3, 2), ENSEMBLE, fence=True)
    op.on_response("a", pb.UNAUTHORIZED)
    op.on_response("b", pb.OK, last_add_confirmed=4)
    op.on_response("c", pb.OK, last_add_confirmed=3)
    assert op.outcome() == 4
