"""Ensemble change (rule 3): a new fragment at LAC+1 with the failed nodes replaced. Pure.

The transform runs inside update_ledger, so after a lost compare-and-set it is re-applied to the record as
it is now: the state decides whether this client may still change the ledger, and replacements are chosen
against the ensemble as stored.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from connector.client.errors import (
    LedgerClosedError,
    LedgerFencedError,
    RecoveryIncompleteError,
    closed_message,
    fenced_message,
)
from connector.client.placement import replace_nodes
from metadata.model import LedgerMetadata, LedgerState, NodeRegistration
from metadata.update_loop import Transform


def check_writer(meta: LedgerMetadata, recovery: bool) -> None:
    """Only the ledger's current writer changes its ensemble: the writer while OPEN, a recovery while
    IN_RECOVERY. IN_RECOVERY fences the writer; CLOSED ends both."""
    if meta.state is LedgerState.CLOSED:
        raise LedgerClosedError(closed_message(meta.ledger_id))
    if recovery and meta.state is not LedgerState.IN_RECOVERY:
        raise RecoveryIncompleteError(f"ledger {meta.ledger_id} left recovery while it was recovered; retry")
    if not recovery and meta.state is not LedgerState.OPEN:
        raise LedgerFencedError(fenced_message(meta.ledger_id))


def change_ensemble(failed: set[str], first_entry_id: int, nodes: Mapping[str, NodeRegistration],
                    recovery: bool = False, exclude: Iterable[str] = ()) -> Transform:
    """exclude: nodes this client saw fail before, which may still be registered (a frozen node)."""
    def transform(meta: LedgerMetadata) -> LedgerMetadata | None:
        check_writer(meta, recovery)
        current = meta.last_fragment.ensemble
        if not failed & set(current):
            return None
        return meta.with_ensemble_from(first_entry_id, replace_nodes(nodes, current, failed, exclude))
    return transform
