"""Which recently failed nodes a writer leaves out of its replacements (placement.Quarantine): for a bounded
time, or until the node registers anew; never forever (issue 15)."""
import random

import pytest

from connector.client.errors import NotEnoughNodesError
from connector.client.placement import Quarantine, replace_nodes
from metadata.model import NodeRegistration, NodeState

NODES = ("a", "b", "c", "d", "e")


def registry(pids: dict[str, int], read_only=()) -> dict[str, NodeRegistration]:
    """Registered nodes with their process ids (a restart registers a new pid)."""
    return {n: NodeRegistration(n, f"127.0.0.1:{7000 + i}", NodeState.READ_ONLY if n in read_only
                                else NodeState.AVAILABLE, pid=pids[n]) for i, n in enumerate(sorted(pids))}


def test_a_failed_node_is_held_until_its_time_is_up():
    nodes = registry({n: 100 for n in NODES})
    quarantine = Quarantine(seconds=60)
    quarantine.add({"a"}, nodes, now=1000)
    assert quarantine.held(nodes, now=1000) == {"a"}
    assert quarantine.held(nodes, now=1059.9) == {"a"}  # still registered as when it failed: frozen, cut off
    assert quarantine.held(nodes, now=1060) == frozenset()


def test_a_node_that_registers_anew_leaves_quarantine_at_once():
    quarantine = Quarantine(seconds=60)
    quarantine.add({"a", "b"}, registry({n: 100 for n in NODES}), now=0)
    restarted = registry({**{n: 100 for n in NODES}, "a": 200})
    assert quarantine.held(restarted, now=1) == {"b"}


def test_a_node_that_was_gone_when_it_failed_leaves_quarantine_when_it_registers():
    quarantine = Quarantine(seconds=60)
    without_a = registry({n: 100 for n in NODES if n != "a"})
    quarantine.add({"a"}, without_a, now=0)
    assert quarantine.held(without_a, now=1) == {"a"}
    assert quarantine.held(registry({n: 100 for n in NODES}), now=2) == frozenset()


def test_a_read_only_node_that_is_writable_again_leaves_quarantine():
    pids = {n: 100 for n in NODES}
    quarantine = Quarantine(seconds=60)
    quarantine.add({"c"}, registry(pids, read_only=("c",)), now=0)
    assert quarantine.held(registry(pids, read_only=("c",)), now=1) == {"c"}
    assert quarantine.held(registry(pids), now=2) == frozenset()


def test_failing_again_starts_the_time_again():
    nodes = registry({n: 100 for n in NODES})
    quarantine = Quarantine(seconds=60)
    quarantine.add({"a"}, nodes, now=0)
    quarantine.add({"a"}, nodes, now=50)
    assert quarantine.held(nodes, now=100) == {"a"}
    assert quarantine.held(nodes, now=110) == frozenset()


def test_what_it_holds_is_bounded_by_the_nodes_that_failed_recently():
    quarantine = Quarantine(seconds=10)
    for step in range(10_000):
        node = f"n{step % 7}"
        nodes = registry({node: step})
        quarantine.add({node}, nodes, now=step)
        quarantine.held(nodes, now=step)
    assert len(quarantine._held) <= 7


def _three_failures_with_restarts(seed: int, exclude) -> list[tuple[str, ...]]:
    """E = 3 on 5 nodes: three different nodes of the ensemble fail one after another, each restarting (a
    new pid) before the next fails. exclude(victim, nodes, now) is the rule under test. The ensembles."""
    rng = random.Random(seed)
    pids = {n: 1 for n in NODES}
    ensembles = [("a", "b", "c")]
    failed: list[str] = []
    for now in (10.0, 20.0, 30.0):
        victim = rng.choice([n for n in ensembles[-1] if n not in failed])
        failed.append(victim)
        nodes = registry(pids)  # read after the failure: the killed node's session has not expired yet
        new = replace_nodes(nodes, ensembles[-1], {victim}, exclude(victim, nodes, now), rng=rng)
        assert victim not in new and len(set(new)) == 3
        ensembles.append(new)
        pids[victim] += 1  # restarted: registered again, with a new pid
    return ensembles


@pytest.mark.parametrize("seed", range(20))
def test_five_nodes_three_failures_with_restarts_always_find_a_replacement(seed):
    quarantine = Quarantine(seconds=60)

    def held(victim, nodes, now):
        quarantine.add({victim}, nodes, now)
        return quarantine.held(nodes, now)

    ensembles = _three_failures_with_restarts(seed, held)
    assert len(ensembles) == 4


@pytest.mark.parametrize("seed", range(5))
def test_the_old_rule_excluding_every_node_that_ever_failed_runs_out_at_the_third_failure(seed):
    ever_failed: set[str] = set()

    def excluded(victim, nodes, now):
        ever_failed.add(victim)
        return ever_failed

    with pytest.raises(NotEnoughNodesError, match="0 available"):
        _three_failures_with_restarts(seed, excluded)


def test_a_frozen_node_is_not_chosen_again_while_held():
    """a froze (still registered, same pid) and was replaced by d; when b fails next, e is chosen, not a."""
    nodes = registry({n: 1 for n in NODES})
    quarantine = Quarantine(seconds=60)
    quarantine.add({"a"}, nodes, now=0)
    for seed in range(20):
        assert replace_nodes(nodes, ("d", "b", "c"), {"b"}, quarantine.held(nodes, now=5),
                             rng=random.Random(seed)) == ("d", "e", "c")
