"""The one compare-and-set loop for versioned records (BookKeeper's MetadataUpdateLoop): ledger metadata
(update_ledger), and the small records of the Spark task registries (update_record). Stream heads have theirs in
streams.update_stream, which also seals pages.

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
from typing import Callable, TypeVar

from kazoo.exceptions import NoNodeError

from metadata import layout
from metadata.errors import MetadataConflictError, MetadataError, ZooKeeperUnreachableError
from metadata.model import LedgerMetadata, Versioned
from metadata.store import MetadataStore, no_reply

T = TypeVar("T")
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
    return update_record(
        store, layout.ledger_path(ledger_id), lambda: store.read_ledger(ledger_id),
        lambda found: transform(found.value),
        lambda updated, version: store.write_ledger(updated, version, placement_epoch),
        what=f"ledger {ledger_id} metadata", current=current, max_attempts=max_attempts,
        unreachable=lambda exc: _unreachable(ledger_id, exc),
    )


def update_record(
    store: MetadataStore,
    path: str,
    read: Callable[[], Versioned[T] | None],
    decide: Callable[[Versioned[T]], T | None],
    write: Callable[[T, int], Versioned[T]],
    *,
    what: str,
    current: Versioned[T] | None = None,
    max_attempts: int = 100,
    unreachable: Callable[[MetadataError], ZooKeeperUnreachableError] | None = None,
) -> Versioned[T] | None:
    """The loop for the record at path: read() it (None: not there), decide() on it as read (None: no change
    wanted), write(updated, version) it as a compare-and-set (MetadataConflictError when the version moved on;
    kazoo's NoNodeError when the record is gone: read again). Returns the record as stored, changed or not; None
    if it is not there (deleted meanwhile). current: the record as the caller just read it (or knows it to be),
    so that the first attempt does not read it. unreachable: the error raised when ZooKeeper stays away."""
    unreachable = unreachable or (lambda exc: _record_unreachable(what, exc))
    lost_at = None  # when the first reply was lost
    for _ in range(max_attempts):
        try:
            if current is None:
                current = read()
                if current is None:
                    return None
            updated = decide(current)
            if updated is None or updated == current.value:
                return current
            return write(updated, current.version)
        except (MetadataConflictError, NoNodeError):
            current = None
        except ZooKeeperUnreachableError as exc:
            raise unreachable(exc) from exc
        except MetadataError as exc:
            if not no_reply(exc):
                raise
            lost_at = lost_at or time.monotonic()
            _resync(store, path, lost_at, exc, unreachable)
            current = None
    raise MetadataConflictError(f"{what} kept changing under {max_attempts} update attempts; try again")


def _resync(store: MetadataStore, path: str, lost_at: float, lost: MetadataError,
            unreachable: Callable[[MetadataError], ZooKeeperUnreachableError]) -> None:
    """Wait for ZooKeeper (until wait_seconds after the first lost reply) and sync, so that the re-read sees
    the lost write if it landed."""
    deadline = lost_at + store.wait_seconds
    try:
        store.resync(path, deadline, lost_at)
    except ZooKeeperUnreachableError as exc:
        raise unreachable(exc) from lost
    except MetadataError as exc:
        if not no_reply(exc):
            raise
        if time.monotonic() >= deadline:  # connected now and then, never long enough to answer
            raise unreachable(exc) from lost


def _record_unreachable(what: str, exc: MetadataError) -> ZooKeeperUnreachableError:
    return ZooKeeperUnreachableError(f"{what} could not be updated, and whether an update of it landed is unknown: "
                                     f"{exc}")


def _unreachable(ledger_id: int, exc: MetadataError) -> ZooKeeperUnreachableError:
    return ZooKeeperUnreachableError(
        f"ledger {ledger_id}: its metadata could not be updated (an ensemble change, close or recovery): {exc}. "
        "Appends pending on it fail and its writer stops; every acknowledged entry is safe. Once ZooKeeper is "
        "back, open the ledger to read it (recovery closes it at its last acknowledged entry) and write to a new "
        "one; a longer $LEDGER_ZK_WAIT_SECONDS rides out longer outages"
    )
