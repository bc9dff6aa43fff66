"""Garbage collection: every --gc-interval seconds, drop the ledgers deleted from metadata, then compact.

A ledger is dropped only when the metadata store says twice that it does not exist: once in the
listing, and again by reading its own znode right before the drop. Ledger ids are never reused and
metadata is always created before any entry is written, so a node that holds entries of a ledger
whose znode is gone holds data of a deleted ledger. Any ZooKeeper error ends the round without
touching anything: "don't know" never deletes (the same rule as rule 8, for metadata).
"""
from __future__ import annotations

import asyncio
import dataclasses
import sys

from metadata import layout
from metadata.errors import MetadataError
from metadata.store import MetadataStore
from storage_node.storage import CompactionResult, Storage


@dataclasses.dataclass(frozen=True)
class GcRound:
    ledgers_deleted: int
    compaction: CompactionResult | None


def deleted_ledgers(store: MetadataStore, held: list[int]) -> list[int]:
    """The held ledgers that no longer exist in metadata, each re-checked (blocking: run in a thread).

    Raises MetadataError when ZooKeeper cannot answer: the caller then does nothing this round.
    """
    existing = set(store.list_ledgers())
    return [ledger_id for ledger_id in held
            if ledger_id not in existing and store.read(layout.ledger_path(ledger_id), bytes) is None]


async def collect_garbage(store: MetadataStore, storage: Storage, compaction_threshold: float) -> GcRound:
    # What the node holds is taken before the listing: a ledger created after the listing is then
    # either not held yet or found by the re-check.
    held = sorted(storage.ledgers)
    gone = await asyncio.to_thread(deleted_ledgers, store, held)
    dropped = await storage.delete_ledgers(gone) if gone else 0
    compaction = await storage.compact(compaction_threshold)
    return GcRound(dropped, compaction)


async def run_periodically(store: MetadataStore, storage: Storage, interval: float, compaction_threshold: float,
                           node_id: str) -> None:
    """The node's garbage collector task; a failed round is logged and the next one tries again."""
    while True:
        await asyncio.sleep(interval)
        try:
            done = await collect_garbage(store, storage, compaction_threshold)
        except MetadataError as exc:
            print(f"storage node {node_id}: garbage collection skipped this round, metadata unavailable: {exc}",
                  file=sys.stderr, flush=True)
            continue
        except Exception as exc:  # an I/O error or damaged record in a file to compact: keep serving
            print(f"storage node {node_id}: garbage collection round failed: {exc!r}", file=sys.stderr, flush=True)
            continue
        if done.ledgers_deleted or done.compaction.deleted:
            print(f"storage node {node_id}: garbage collection dropped {done.ledgers_deleted} deleted ledger(s), "
                  f"removed {len(done.compaction.deleted)} file(s), reclaimed {done.compaction.reclaimed_bytes} "
                  f"bytes", flush=True)
