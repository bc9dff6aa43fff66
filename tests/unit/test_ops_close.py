"""Close (rules 4, 12) and ensemble change (rule 3) metadata transforms."""
import pytest

from connector.client.errors import LedgerClosedError, LedgerFencedError, NotEnoughNodesError, RecoveryRestartError
from connector.client.ops.close import close_own, close_recovered
from connector.client.ops.ensemble_change import change_ensemble
from metadata.model import Fragment, LedgerMetadata, LedgerState, NodeRegistration


def meta(state=LedgerState.OPEN, last=-1, fragments=((0, ("a", "b", "c")),)):
    return LedgerMetadata(7, 3, 3, 2, tuple(Fragment(f, e) for f, e in fragments), state=state, last_entry_id=last)


NODES = {n: NodeRegistration(n, "127.0.0.1:1") for n in "abcd"}


def test_writer_close_sets_closed_and_last_entry():
    closed = close_own(7, 41, 100)(meta())
    assert (closed.state, closed.last_entry_id, closed.length) == (LedgerState.CLOSED, 41, 100)


def test_closing_twice_is_safe():
    assert close_own(7, 41, 100)(meta(LedgerState.CLOSED, 41)) is None


@pytest.mark.parametrize("found", [meta(LedgerState.IN_RECOVERY), meta(LedgerState.CLOSED, 40)])
def test_writer_close_of_a_recovered_ledger_is_fenced(found):
    with pytest.raises(LedgerFencedError, match="ledger 7 is fenced"):
        close_own(7, 41, 100)(found)


FIRST = (Fragment(0, ("a", "b", "c")),)


def test_recovery_close_adopts_a_ledger_closed_by_another_recovery():
    assert close_recovered(41, -1, FIRST, FIRST)(meta(LedgerState.CLOSED, 45)) is None
    assert close_recovered(41, -1, FIRST, FIRST)(meta(LedgerState.IN_RECOVERY)).last_entry_id == 41


def test_recovery_close_stores_the_write_back_fragments_in_the_same_update():
    changed = FIRST + (Fragment(40, ("a", "d", "c")),)
    closed = close_recovered(41, -1, FIRST, changed)(meta(LedgerState.IN_RECOVERY))
    assert (closed.state, closed.last_entry_id, closed.fragments) == (LedgerState.CLOSED, 41, changed)


def test_recovery_close_is_refused_when_the_stored_fragments_changed_since_the_recovery_read_them():
    stored = meta(LedgerState.IN_RECOVERY, fragments=((0, ("a", "b", "c")), (40, ("a", "d", "c"))))
    with pytest.raises(RecoveryRestartError, match="changed while it was recovered"):
        close_recovered(41, -1, FIRST, FIRST)(stored)


def test_ensemble_change_adds_a_fragment_at_lac_plus_one():
    changed = change_ensemble({"b"}, 10, NODES)(meta())
    assert changed.fragments == (Fragment(0, ("a", "b", "c")), Fragment(10, ("a", "d", "c")))


def test_ensemble_change_replaces_a_last_fragment_starting_at_the_same_entry():
    before = meta(fragments=((0, ("a", "b", "c")), (10, ("a", "d", "c"))))
    nodes = dict(NODES, e=NodeRegistration("e", "127.0.0.1:2"))
    changed = change_ensemble({"d"}, 10, nodes, exclude={"b"})(before)
    assert changed.fragments == (Fragment(0, ("a", "b", "c")), Fragment(10, ("a", "e", "c")))


def test_ensemble_change_on_recovered_ledger_fences_the_writer_and_on_closed_reports_closed():
    with pytest.raises(LedgerFencedError):
        change_ensemble({"b"}, 10, NODES)(meta(LedgerState.IN_RECOVERY))
    with pytest.raises(LedgerClosedError):
        change_ensemble({"b"}, 10, NODES)(meta(LedgerState.CLOSED, 9))
    assert change_ensemble({"b"}, 10, NODES, recovery=True)(meta(LedgerState.IN_RECOVERY)) is not None


def test_ensemble_change_without_spare_nodes():
    with pytest.raises(NotEnoughNodesError):
        change_ensemble({"b"}, 10, {n: NODES[n] for n in "abc"})(meta())
