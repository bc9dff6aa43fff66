"""Choosing nodes for a new ensemble or to replace failed ones, from the registered nodes. Pure."""
from __future__ import annotations

import random
from typing import Iterable, Mapping

from connector.client.errors import NotEnoughNodesError
from metadata.model import NodeRegistration, NodeState


def writable(nodes: Mapping[str, NodeRegistration], exclude: Iterable[str] = ()) -> list[str]:
    """Node ids that accept normal adds: registered, not read-only, not excluded."""
    excluded = set(exclude)
    return sorted(n for n, reg in nodes.items() if reg.state is NodeState.AVAILABLE and n not in excluded)


def choose_ensemble(
    nodes: Mapping[str, NodeRegistration], size: int, exclude: Iterable[str] = (), rng: random.Random | None = None,
) -> tuple[str, ...]:
    candidates = writable(nodes, exclude)
    if len(candidates) < size:
        raise NotEnoughNodesError(
            f"an ensemble of {size} needs {size} writable storage nodes, {len(candidates)} available "
            f"({len(nodes)} registered); start more nodes or use a smaller ensemble_size"
        )
    return tuple((rng or random).sample(candidates, size))


def replace_nodes(
    nodes: Mapping[str, NodeRegistration], ensemble: tuple[str, ...], failed: Iterable[str],
    exclude: Iterable[str] = (), rng: random.Random | None = None,
) -> tuple[str, ...]:
    """The ensemble with every failed node swapped for a writable node not in it (rule 3)."""
    failed = set(failed) & set(ensemble)
    candidates = writable(nodes, set(ensemble) | failed | set(exclude))
    if len(candidates) < len(failed):
        raise NotEnoughNodesError(
            f"replacing {len(failed)} failed node(s) {sorted(failed)} needs {len(failed)} writable storage "
            f"node(s) outside the ensemble, {len(candidates)} available; start more nodes"
        )
    chosen = iter((rng or random).sample(candidates, len(failed)))
    return tuple(next(chosen) if node in failed else node for node in ensemble)
