"""AddSequence.on_results (a node's AddRange, issue 17) does exactly what on_result for each entry of the range
in turn does: AQ acks per entry from its own write set, completion strictly in entry order, the LAC only over
the gap-free prefix, refusals and node failures as the first answered entry says (rules 2 and 3)."""
from __future__ import annotations

import time

from hypothesis import given, settings, strategies as st

from connector.client.errors import LedgerFencedError
from connector.client.ops.add import AddSequence
from connector.client.schedule import Schedule
from protos import ledger_pb2 as pb

NODES = ("a", "b", "c", "d")
QUORUMS = [(3, 3, 2), (3, 2, 2), (4, 2, 1), (4, 3, 2), (2, 2, 2), (1, 1, 1)]
STATUSES = [pb.OK] * 6 + [pb.ERROR, pb.READ_ONLY, pb.FENCED, pb.UNAUTHORIZED, pb.BAD_REQUEST, pb.TOO_LARGE]

events = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 4)),
    st.tuples(st.just("range"), st.sampled_from(NODES), st.integers(-2, 14), st.integers(0, 6),
              st.sampled_from(STATUSES)),
    st.tuples(st.just("fail"), st.sampled_from(NODES)),
    st.tuples(st.just("replace"), st.sampled_from(NODES), st.sampled_from(NODES)),
), max_size=30)


def _state(seq: AddSequence) -> tuple:
    return (seq.last_add_confirmed, seq.next_entry_id, seq.length, sorted(seq.failed_nodes), dict(seq.node_lac),
            seq.ensemble, type(seq.error), str(seq.error) if seq.error else None,
            [(e, a.write_set, sorted(a.acked)) for e, a in seq.pending.items()])


@settings(max_examples=400)
@given(st.sampled_from(QUORUMS), events)
def test_a_range_answer_is_the_per_entry_answers_in_turn(quorums, script):
    e, wq, aq = quorums
    ensemble = NODES[:e]
    by_range, by_entry = (AddSequence(7, Schedule(e, wq, aq), ensemble) for _ in range(2))
    for event in script:
        if event[0] == "append":
            for n in range(event[1]):
                if by_entry.error is not None:
                    break
                payload = b"p%d" % by_entry.next_entry_id
                assert by_range.append(payload)[1] == by_entry.append(payload)[1]
        elif event[0] == "range":
            _, node, first, span, status = event
            last = first + span
            got = by_range.on_results(node, first, last, status, "why")
            expected = [add for entry_id in range(first, last + 1)
                        for add in by_entry.on_result(node, entry_id, status, "why")]
            assert [a.entry_id for a in got] == [a.entry_id for a in expected]
        elif event[0] == "fail":
            by_range.on_node_failure(event[1])
            by_entry.on_node_failure(event[1])
        else:
            _, old, new = event
            if old in by_entry.ensemble and new not in by_entry.ensemble and old in by_entry.failed_nodes:
                ensemble = tuple(new if n == old else n for n in by_entry.ensemble)
                resent, completed = by_range.replace_nodes(ensemble)
                resent_too, completed_too = by_entry.replace_nodes(ensemble)
                assert [(n, a.entry_id) for n, a in resent] == [(n, a.entry_id) for n, a in resent_too]
                assert [a.entry_id for a in completed] == [a.entry_id for a in completed_too]
        assert _state(by_range) == _state(by_entry)


def test_a_full_range_completes_in_entry_order_at_the_ack_quorum():
    seq = AddSequence(7, Schedule(3, 3, 2), ("a", "b", "c"))
    for _ in range(10):
        seq.append(b"x")
    assert seq.on_results("a", 0, 9, pb.OK) == []                 # one ack of two
    assert [a.entry_id for a in seq.on_results("b", 5, 9, pb.OK)] == []     # 0..4 still lack their second ack
    assert [a.entry_id for a in seq.on_results("c", 0, 4, pb.OK)] == list(range(10))
    assert seq.last_add_confirmed == 9 and not seq.pending


def test_a_striped_range_counts_only_the_entries_whose_write_set_holds_the_node():
    seq = AddSequence(7, Schedule(3, 2, 2), ("a", "b", "c"))
    for _ in range(6):
        seq.append(b"x")
    # A range that claims entries outside b's write sets (b holds 0, 1, 3, 4) acks only those it holds.
    seq.on_results("b", 0, 5, pb.OK)
    assert [e for e, add in seq.pending.items() if "b" in add.acked] == [0, 1, 3, 4]
    assert [a.entry_id for a in seq.on_results("a", 0, 0, pb.OK)] == [0]


def test_a_refused_range_fails_the_ledger_naming_its_first_answered_entry():
    seq = AddSequence(7, Schedule(3, 3, 2), ("a", "b", "c"))
    for _ in range(4):
        seq.append(b"x")
    seq.on_results("a", 0, 0, pb.OK)
    seq.on_results("b", 0, 0, pb.OK)
    assert seq.on_results("c", 0, 3, pb.FENCED, "fenced") == []
    assert isinstance(seq.error, LedgerFencedError) and "7" in str(seq.error) and not seq.pending
    assert seq.last_add_confirmed == 0


def test_a_range_far_wider_than_what_is_pending_costs_only_the_pending_entries():
    seq = AddSequence(7, Schedule(3, 3, 2), ("a", "b", "c"))
    for _ in range(3):
        seq.append(b"x")
    seq.on_results("a", 0, 2, pb.OK)
    started = time.perf_counter()
    assert [a.entry_id for a in seq.on_results("b", -(1 << 62), 1 << 62, pb.OK)] == [0, 1, 2]
    assert seq.on_results("c", 0, 1 << 62, pb.ERROR) == []
    assert time.perf_counter() - started < 1.0
