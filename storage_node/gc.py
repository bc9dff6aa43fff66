"""Garbage collection: every --gc-interval seconds, drop the ledgers deleted from metadata, then compact.

A ledger is dropped only when the metadata store says twice that it does not exist: once in the
listing of /ledgers or by an exists request for its znode, and again by reading its znode right before
the drop. Ledger ids are never reused and metadata is always created before any entry is written, so a
node that holds entries of a ledger whose znode is gone holds data of a deleted ledger. Any ZooKeeper
error ends the round without touching anything: "don't know" never deletes (the same rule as rule 8, for
metadata).

DESIGN rule 8: garbage collection drops a ledger only after a ZooKeeper `sync` shows it deleted, and
never one the node first saw less than a grace period ago. The node's session may sit on a follower
that has not yet applied a ledger's creation; without the sync, a listing and a re-read there both say
"no such ledger" for one this node has just acknowledged entries of, and the node would drop it and
answer NO_LEDGER, which recovery counts as a negative (a truncation). So the ledgers directory is
synced before the listing (or the exists requests) and before every re-check, and a ledger the node
first saw (its first add, fence or LAC here, or the replay after a restart) less than --gc-grace seconds
ago is not even considered. The grace is the second line of defence: whatever else makes ZooKeeper
briefly disagree with what a writer saw (an ensemble restored from a backup, a server that lost its state)
cannot drop a ledger the node has just taken writes for.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Iterable

from metadata import layout
from metadata.errors import MetadataError
from metadata.store import MetadataStore
from storage_node.storage import CompactionResult, Storage

_log = logging.getLogger(__name__)
# An exists request and its reply take about as many bytes as 8 names in a listing of /ledgers (some 120 bytes
# against 15), and ZooKeeper copies every name for a listing: the held ledgers are checked one by one while they
# are at most an 8th of the ledgers in metadata.
EXISTS_PER_NAME = 8


@dataclasses.dataclass(frozen=True)
class GcRound:
    ledgers_deleted: int
    compaction: CompactionResult | None


def deleted_ledgers(store: MetadataStore, held: list[int]) -> list[int]:
    """The held ledgers that no longer exist in metadata, each re-checked (blocking: run in a thread).

    What a round asks ZooKeeper follows what the node holds, not the cluster: nothing at all when it holds no
    ledger past the grace; an exists request for each held ledger (pipelined) while they are few against the
    ledgers in metadata (the count of /ledgers' children, from its stat); the listing of /ledgers only when that
    is cheaper (EXISTS_PER_NAME). The checks and every re-check follow a ZooKeeper sync (rule 8). Raises
    MetadataError when ZooKeeper cannot answer: the caller then does nothing this round.
    """
    if not held:
        return []
    store.sync(layout.LEDGERS)
    ledgers = store.stat(layout.LEDGERS)
    if ledgers is None:                     # not "every ledger is deleted": a metadata root that is not there
        raise MetadataError(f"{layout.LEDGERS} is missing from the metadata root")
    if len(held) * EXISTS_PER_NAME <= ledgers.numChildren:
        there = store.exist([layout.ledger_path(ledger_id) for ledger_id in held])
        missing = [ledger_id for ledger_id, found in zip(held, there) if not found]
    else:
        existing = set(store.list_ledgers())
        missing = [ledger_id for ledger_id in held if ledger_id not in existing]
    return [ledger_id for ledger_id in missing if _still_deleted(store, ledger_id)]


def _still_deleted(store: MetadataStore, ledger_id: int) -> bool:
    store.sync(layout.LEDGERS)
    return store.read(layout.ledger_path(ledger_id), bytes) is None


def past_grace(storage: Storage, ledger_ids: Iterable[int], grace: float) -> list[int]:
    """The ledgers among ledger_ids that the node holds and first saw at least grace seconds ago."""
    seen_by = time.monotonic() - grace
    return [ledger_id for ledger_id in ledger_ids
            if (state := storage.ledgers.get(ledger_id)) is not None and state.first_seen <= seen_by]


async def collect_garbage(store: MetadataStore, storage: Storage, compaction_threshold: float,
                          grace: float) -> GcRound:
    # What the node holds is taken before the listing: a ledger created after the listing is then
    # either not held yet or found by the re-check.
    held = past_grace(storage, sorted(storage.ledgers), grace)
    gone = await asyncio.to_thread(deleted_ledgers, store, held)
    # Checked again: a late writer may have re-created a ledger of that id meanwhile (a fresh state).
    gone = past_grace(storage, gone, grace)
    dropped = await storage.delete_ledgers(gone) if gone else 0
    compaction = await storage.compact(compaction_threshold)
    return GcRound(dropped, compaction)


async def run_periodically(store: MetadataStore, storage: Storage, interval: float, compaction_threshold: float,
                           grace: float, node_id: str = "") -> None:
    """The node's garbage collector task; a failed round is logged and the next one tries again.
    node_id is not used any more (every log line names the node); it goes once node.py stops passing it."""
    while True:
        await asyncio.sleep(interval)
        try:
            done = await collect_garbage(store, storage, compaction_threshold, grace)
        except MetadataError as exc:
            _log.warning("garbage collection skipped this round, metadata unavailable: %s", exc)
            continue
        except Exception as exc:  # an I/O error or damaged record in a file to compact: keep serving
            _log.error("garbage collection round failed: %r", exc)
            continue
        if done.ledgers_deleted or done.compaction.deleted:
            _log.info("garbage collection dropped %d deleted ledger(s), removed %d file(s), reclaimed %d bytes",
                      done.ledgers_deleted, len(done.compaction.deleted), done.compaction.reclaimed_bytes)
