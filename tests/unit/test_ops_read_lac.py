"""The long poll of a tailing reader (WaitLacOp): done at the first LAC past the previous one, or at quorum
coverage of answers without news; an error status is that node's failure, not "no news"."""
import pytest

from connector.client.errors import NodeError
from connector.client.ops.read_lac import WaitLacOp
from connector.client.schedule import Schedule
from protos import ledger_pb2 as pb

ENSEMBLE = ("a", "b", "c")


def poll(previous=4):
    return WaitLacOp(7, Schedule(3, 3, 2), ENSEMBLE, previous)


def test_the_first_lac_past_the_previous_one_ends_the_poll():
    op = poll()
    op.on_response("b", pb.OK, 6, 6)
    assert op.done and op.outcome() == 6


def test_answers_without_news_end_the_poll_at_quorum_coverage_not_waiting_for_a_paused_node():
    op = poll()
    op.on_response("a", pb.OK, 4, 4)
    assert not op.done
    op.on_response("b", pb.NO_LEDGER)   # a node that never saw the ledger answers too
    assert op.done and op.outcome() == 4


def test_an_op_given_up_before_coverage_says_no_news():
    op = poll()
    op.on_response("a", pb.OK, 4, 4)
    assert not op.done and op.outcome() == 4


def test_an_error_status_is_a_failure_of_its_node_not_an_answer_without_news():
    """Every node answered BAD_REQUEST to a wait longer than theirs, and the client took it as "no news" at once
    (audit 2026-11-29, finding 5)."""
    op = poll()
    for node in ENSEMBLE:
        op.on_response(node, pb.BAD_REQUEST, message="timeout_ms must be 0..120000")
    assert op.done and not op.covered
    with pytest.raises(NodeError, match="BAD_REQUEST timeout_ms must be 0..120000"):
        op.outcome()


def test_one_failed_node_leaves_coverage_to_the_others():
    op = poll()
    op.on_response("a", pb.ERROR, message="disk")
    op.on_response("b", pb.OK, 3, 3)
    assert not op.done
    op.on_response("c", pb.OK, 4, 4)
    assert op.done and op.outcome() == 4
