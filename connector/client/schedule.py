"""Quorum arithmetic, pure (BookKeeper's RoundRobinDistributionSchedule): write sets, ack sets, coverage.

Positions are indices into a fragment's ensemble; callers map them to node ids.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable


@dataclasses.dataclass(frozen=True)
class Schedule:
    ensemble_size: int
    write_quorum: int
    ack_quorum: int

    def __post_init__(self) -> None:
        if not self.ensemble_size >= self.write_quorum >= self.ack_quorum >= 1:
            raise ValueError(
                f"need ensemble_size >= write_quorum >= ack_quorum >= 1, got E={self.ensemble_size} "
                f"WQ={self.write_quorum} AQ={self.ack_quorum}"
            )

    def write_set(self, entry_id: int) -> tuple[int, ...]:
        """Rule 1: ensemble positions (e + i) % E for i < WQ."""
        return tuple((entry_id + i) % self.ensemble_size for i in range(self.write_quorum))

    def write_set_nodes(self, entry_id: int, ensemble: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(ensemble[position] for position in self.write_set(entry_id))

    def has_ack_quorum(self, acked: Iterable[int | str], write_set: Iterable[int | str]) -> bool:
        """Rule 2: an add succeeds at AQ acks from its write set (acks from elsewhere do not count)."""
        acked = acked if type(acked) is set else set(acked)
        return len(acked) >= self.ack_quorum and len(acked.intersection(write_set)) >= self.ack_quorum

    @property
    def negative_threshold(self) -> int:
        """Rule 11: NO_ENTRY/NO_LEDGER answers from an entry's write set needed to call it absent."""
        return self.write_quorum - self.ack_quorum + 1

    def covered(self, satisfied: Iterable[int]) -> bool:
        """Rule 10: every WQ-window of the ensemble has fewer than AQ positions not satisfying the property.

        Equivalently no ack quorum of any entry's write set is left entirely unsatisfied, so a writer that
        needs AQ acks from some window cannot find AQ unfenced nodes in it.
        """
        done = set(satisfied)
        return all(
            len(set(self.write_set(first)) - done) < self.ack_quorum for first in range(self.ensemble_size)
        )
