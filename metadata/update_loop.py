"""The one compare-and-set loop for ledger metadata (BookKeeper's MetadataUpdateLoop).

Read, transform a copy, write with the version read; on conflict re-read and transform again. The
transform decides, from the current record, whether an update is still wanted (returning None when
not, e.g. when another client closed the ledger first).
"""
from __future__ import annotations

from typing import Callable

from metadata.errors import MetadataConflictError
from metadata.model import LedgerMetadata, Versioned
from metadata.store import MetadataStore

Transform = Callable[[LedgerMetadata], LedgerMetadata | None]


def update_ledger(
    store: MetadataStore,
    ledger_id: int,
    transform: Transform,
    current: Versioned[LedgerMetadata] | None = None,
    max_attempts: int = 100,
) -> Versioned[LedgerMetadata]:
    """Apply transform until it sticks; returns the record as stored (changed or not)."""
    for _ in range(max_attempts):
        if current is None:
            current = store.read_ledger(ledger_id)
        updated = transform(current.value)
        if updated is None or updated == current.value:
            return current
        try:
            return store.write_ledger(updated, current.version)
        except MetadataConflictError:
            current = None
    raise MetadataConflictError(
        f"ledger {ledger_id} metadata kept changing under {max_attempts} update attempts; try again"
    )
