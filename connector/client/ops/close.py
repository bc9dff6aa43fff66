"""Closing a ledger (rules 4 and 12): the metadata transforms for update_ledger. Pure."""
from __future__ import annotations

from typing import Mapping

from connector.client.errors import LedgerFencedError, RecoveryRestartError, fenced_message
from metadata.model import Fragment, LedgerMetadata, LedgerState, make_custom_metadata
from metadata.update_loop import Transform


def close_own(ledger_id: int, last_add_confirmed: int, length: int,
              custom_metadata: Mapping[str, object] | None = None) -> Transform:
    """Rule 4: the writer closes at its LAC; closing again at the same entry changes nothing. A ledger that
    is in recovery, or was closed elsewhere at another entry, was taken from this writer.

    custom_metadata (what the writer learned while writing, e.g. an arrow ledger's row index) is merged into
    the ledger's in the same compare-and-set; a ledger found closed already keeps the metadata it has."""
    def transform(meta: LedgerMetadata) -> LedgerMetadata | None:
        if meta.state is LedgerState.IN_RECOVERY or (
                meta.state is LedgerState.CLOSED and meta.last_entry_id != last_add_confirmed):
            raise LedgerFencedError(fenced_message(ledger_id))
        if meta.state is LedgerState.CLOSED:
            return None
        closed = meta.closed_at(last_add_confirmed, length)
        if custom_metadata:
            closed = closed.replace(custom_metadata=make_custom_metadata({**meta.custom, **custom_metadata}))
        return closed
    return transform


def close_recovered(last_entry_id: int, length: int, fragments_read: tuple[Fragment, ...],
                    fragments: tuple[Fragment, ...]) -> Transform:
    """Rule 12: IN_RECOVERY -> CLOSED at the last recovered entry, storing in the same compare-and-set the
    fragments the recovery's write-back made (fragments: the record as the recovery read it, fragments_read,
    plus its own ensemble changes). A recovery never stores a fragment on its own: a later recovery would
    fence and read only the new last fragment and could count an acknowledged entry as absent.

    Refused (RecoveryRestartError, the recovery starts again from the stored record) if the stored fragments
    are no longer those the recovery read. A ledger another recovery closed first is adopted as it is
    (returning None keeps the stored record)."""
    def transform(meta: LedgerMetadata) -> LedgerMetadata | None:
        if meta.state is LedgerState.CLOSED:
            return None
        if meta.fragments != fragments_read:
            raise RecoveryRestartError(
                f"the fragments of ledger {meta.ledger_id} changed while it was recovered; recovering again "
                "from the stored metadata")
        return meta.replace(fragments=fragments).closed_at(last_entry_id, length)
    return transform
