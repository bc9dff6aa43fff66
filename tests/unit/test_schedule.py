"""Rule 1 (write sets), rule 2 (ack quorum), rule 10 (coverage), rule 11 (negative threshold)."""
import itertools

import pytest
from hypothesis import given, strategies as st

from connector.client.schedule import Schedule


def test_write_set_stripes_over_the_ensemble():
    schedule = Schedule(5, 3, 2)
    assert schedule.write_set(0) == (0, 1, 2)
    assert schedule.write_set(3) == (3, 4, 0)
    assert schedule.write_set(9) == (4, 0, 1)
    assert schedule.write_set_nodes(4, ("a", "b", "c", "d", "e")) == ("e", "a", "b")


def test_full_replication_writes_every_node():
    assert Schedule(3, 3, 2).write_set(7) == (1, 2, 0)


@pytest.mark.parametrize("wq, aq, required", [
    (2, 1, 2), (2, 2, 1), (3, 1, 3), (3, 2, 2), (3, 3, 1), (4, 2, 3), (4, 3, 2), (4, 4, 1),
])
def test_negative_threshold_table_of_seed_002(wq, aq, required):
    assert Schedule(wq, wq, aq).negative_threshold == required


def test_ack_quorum_counts_only_the_write_set():
    schedule = Schedule(4, 2, 2)
    assert schedule.has_ack_quorum({"a", "b"}, ("a", "b"))
    assert not schedule.has_ack_quorum({"a", "c"}, ("a", "b"))


@pytest.mark.parametrize("e, aq", [(3, 2), (3, 1), (3, 3), (5, 2), (4, 4)])
def test_coverage_with_full_replication_is_e_minus_aq_plus_one(e, aq):
    schedule = Schedule(e, e, aq)
    for count in range(e + 1):
        for answered in itertools.combinations(range(e), count):
            assert schedule.covered(answered) == (count >= e - aq + 1)


def test_coverage_of_a_striped_ensemble_needs_every_window():
    schedule = Schedule(4, 2, 2)  # windows {0,1} {1,2} {2,3} {3,0}: one fenced node in each
    assert schedule.covered({0, 2})
    assert not schedule.covered({0, 1})  # window {2,3} is an ack quorum left unfenced


def test_invalid_quorums_are_refused():
    with pytest.raises(ValueError, match="ensemble_size >= write_quorum"):
        Schedule(2, 3, 2)


quorums = st.integers(1, 6).flatmap(
    lambda e: st.integers(1, e).flatmap(lambda wq: st.tuples(st.just(e), st.just(wq), st.integers(1, wq))))


@given(quorums, st.data())
def test_coverage_leaves_no_ack_quorum_of_any_write_set_unknown(q, data):
    e, wq, aq = q
    schedule = Schedule(e, wq, aq)
    answered = data.draw(st.sets(st.integers(0, e - 1)))
    if schedule.covered(answered):
        for entry in range(e):
            for ack_quorum in itertools.combinations(schedule.write_set(entry), aq):
                assert set(ack_quorum) & answered, (ack_quorum, answered)
    else:
        assert any(
            not set(ack_quorum) & answered
            for entry in range(e) for ack_quorum in itertools.combinations(schedule.write_set(entry), aq)
        )


@given(quorums)
def test_negative_threshold_leaves_fewer_than_aq_possible_holders(q):
    e, wq, aq = q
    schedule = Schedule(e, wq, aq)
    assert wq - schedule.negative_threshold < aq
    assert wq - (schedule.negative_threshold - 1) >= aq
