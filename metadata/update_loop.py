"""The one compare-and-set loop for ledger metadata (BookKeeper's MetadataUpdateLoop).

Read, transform a copy, write with the version read; on conflict re-read and transform again. The
transform decides, from the current record, whether an update is still wanted (returning None when
not, e.g. when another client closed the ledger first).

A write whose reply was lost (the connection dropped, the session expired) has an unknown outcome, not a
failed one (DESIGN rule 16): the loop waits for ZooKeeper, syncs, re-reads and transforms again. The
transform then finds its own update in the record if it landed (a close finds the ledger closed at its
entry, an ensemble change finds the failed nodes replaced) and returns None, or decides afresh if it did
not. So an ensemble change or a close that meets a ZooKeeper outage waits for it and completes, instead of
failing the ledger; only an outage longer than the store's wait_seconds ($LEDGER_ZK_WAIT_SECONDS, counted from
the first lost reply, or by the call that found ZooKeeper away) fails it, with ZooKeeperUnreachableError.
"""
from __future__ import annotations

import time
from typing import Callable

from metadata import layout
from metadata.errors import MetadataConflictError, MetadataError, ZooKeeperUnreachableError
from metadata.model import LedgerMetadata, Versioned
from metadata.store import MetadataStore, no_reply

Transform = Callable[[LedgerMetadata], LedgerMetadata | None]


def update_ledger(
    store: MetadataStore,
    ledger_id: int,
    transform: Transform,
    current: Versioned[LedgerMetadata] | None = None,
    max_attempts: int = 100,
    placement_epoch: int | None = None,
) -> Versioned[LedgerMetadata]:
    """Apply transform until it sticks; returns the record as stored (changed or not). placement_epoch: the
    transform names nodes chosen from registry.Placement at that epoch; PlacementChangedError (nothing written)
    once a node was marked decommissioned since: the caller chooses again."""
    lost_at = None  # when the first reply was lost
    for _ in range(max_attempts):
        try:
            if current is None:
                current = store.read_ledger(ledger_id)
            updated = transform(current.value)
            if updated is None or updated == current.value:
                return current
            return store.write_ledger(updated, current.version, placement_epoch)
        except MetadataConflictError:
            current = None
        except ZooKeeperUnreachableError as exc:
            raise _unreachable(ledger_id, exc) from exc
        except MetadataError as exc:
            if not no_reply(exc):
                raise
            lost_at = lost_at or time.monotonic()
            _resync(store, ledger_id, lost_at, exc)
            current = None
    raise MetadataConflictError(
        f"ledger {ledger_id} metadata kept changing under {max_attempts} update attempts; try again"
    )


def _resync(store: MetadataStore, ledger_id: int, lost_at: float, lost: MetadataError) -> None:
    """Wait for ZooKeeper (until wait_seconds after the first lost reply) and sync, so that the re-read sees
    the lost write if it landed."""
    deadline = lost_at + store.wait_seconds
    try:
        store.resync(layout.ledger_path(ledger_id), deadline, lost_at)
    except ZooKeeperUnreachableError as exc:
        raise _unreachable(ledger_id, exc) from lost
    except MetadataError as exc:
        if not no_reply(exc):
            raise
        if time.monotonic() >= deadline:  # connected now and then, never long enough to answer
            raise _unreachable(ledger_id, exc) from lost


def _unreachable(ledger_id: int, exc: MetadataError) -> ZooKeeperUnreachableError:
    return ZooKeeperUnreachableError(
        f"ledger {ledger_id}: its metadata could not be updated (an ensemble change, close or recovery): {exc}. "
        "Appends pending on it fail and its writer stops; every acknowledged entry is safe. Once ZooKeeper is "
        "back, open the ledger to read it (recovery closes it at its last acknowledged entry) and write to a new "
        "one; a longer $LEDGER_ZK_WAIT_SECONDS rides out longer outages"
    )
