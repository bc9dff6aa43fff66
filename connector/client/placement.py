"""Choosing nodes for a new ensemble or to replace failed ones, from the registered nodes, and which recently
failed nodes a writer leaves out meanwhile. Pure."""
from __future__ import annotations

import random
from typing import Iterable, Mapping

from connector.client.errors import NotEnoughNodesError
from metadata.model import NodeRegistration, NodeState

QUARANTINE_SECONDS = 60.0  # several ZooKeeper session timeouts: a dead node has left the registry by then


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


class Quarantine:
    """Nodes that failed a writer recently, left out of its replacements for a while (BookKeeper's bookie
    quarantine, bookieQuarantineTime).

    Why at all: a node that failed may still be registered, frozen, cut off from this client only, or killed
    before ZooKeeper expired its session; choosing it again costs another ensemble change. Why not forever
    (the old rule): a long-lived ledger then runs out of nodes; with 5 nodes and E = 3 its third failure
    failed it with NotEnoughNodesError although every node was back. So a node leaves quarantine `seconds`
    after its last failure, or as soon as its registration differs from the one it had when it failed (a
    restarted node registers anew, with its new pid; a read-only node that is writable again). It holds at
    most one entry per node that failed in the last `seconds`. The caller passes the clock and the registry.
    """

    def __init__(self, seconds: float = QUARANTINE_SECONDS):
        self.seconds = seconds
        self._held: dict[str, tuple[float, NodeRegistration | None]] = {}  # node -> (until, registration)

    def add(self, failed: Iterable[str], nodes: Mapping[str, NodeRegistration], now: float) -> None:
        """failed just failed; nodes is the registry as read after the failure."""
        for node in failed:
            self._held[node] = (now + self.seconds, nodes.get(node))

    def held(self, nodes: Mapping[str, NodeRegistration], now: float) -> frozenset[str]:
        """The nodes still in quarantine, given the registry now; the others are forgotten."""
        self._held = {node: (until, registration) for node, (until, registration) in self._held.items()
                      if now < until and nodes.get(node) == registration}
        return frozenset(self._held)
