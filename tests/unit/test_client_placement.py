"""Choosing ensembles and replacements from the registered nodes."""
import random

import pytest

from connector.client.errors import NotEnoughNodesError
from connector.client.placement import choose_ensemble, replace_nodes
from metadata.model import NodeRegistration, NodeState


def nodes(*ids, read_only=()):
    return {n: NodeRegistration(n, f"127.0.0.1:{i}", NodeState.READ_ONLY if n in read_only else NodeState.AVAILABLE)
            for i, n in enumerate(ids)}


def test_ensemble_skips_read_only_and_excluded_nodes():
    for seed in range(20):
        chosen = choose_ensemble(nodes("a", "b", "c", "d", "e", read_only=("b",)), 3, exclude=("c",),
                                 rng=random.Random(seed))
        assert len(set(chosen)) == 3 and set(chosen) <= {"a", "d", "e"}


def test_not_enough_nodes_says_how_many():
    with pytest.raises(NotEnoughNodesError, match="needs 3 writable storage nodes, 2 available"):
        choose_ensemble(nodes("a", "b", "c", read_only=("a",)), 3)


def test_replacement_keeps_positions_and_avoids_the_ensemble():
    new = replace_nodes(nodes("a", "b", "c", "d"), ("a", "b", "c"), {"b"})
    assert new == ("a", "d", "c")


def test_replacement_without_spare_node_fails():
    with pytest.raises(NotEnoughNodesError, match="1 failed node"):
        replace_nodes(nodes("a", "b", "c"), ("a", "b", "c"), {"c"})
