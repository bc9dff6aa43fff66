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

Over-replicated ledgers (BookKeeper's over-replicated ledger collection, gcOverreplicatedLedgerWaitTime): every
--gc-overreplicated-interval seconds (its first check in the node's first round) a round also drops the copies of
ledgers that are CLOSED and whose metadata names this node in no fragment (metadata.model.over_replicated_on): those
the auditor re-replicated elsewhere while the node was away longer than --lost-after, a decommission's moves, a
losing recovery's write-back to a replacement. The danger is a re-replication that copies to this node before the
compare-and-set that names it: the metadata the round reads does not name the node yet, and dropping the copies
just before that CAS lands would leave the metadata naming a node without the entries. So for each such ledger
past the grace the round
1. refuses every add to it (recovery adds too: ERROR, which a repair takes as this replacement failing),
2. advances its copy_drops by a compare-and-set at the version it read and found CLOSED and not naming the node
   (a changed record: the ledger is left alone this round), and only then
3. drops it (a DELETE record, as for a deleted ledger) and takes adds again.
A repair stores its copies only while copy_drops is what it read before copying (replace_in_fragment), so a
repair whose copies came before step 1 fails its CAS and copies again: refused until step 3 ends, onto an empty
ledger after it. A CAS that merely rewrote the same data would not do: the repair's update loop re-reads after a
conflict, finds the fragment as it planned it and names the node all the same. Any doubt does nothing: a read
that is not answered in time, a record that cannot be decoded, a CAS whose reply was lost (it may have landed: the
next round reads the new version and tries again). A restart between step 2 and step 3 leaves garbage that the
next check finds again. Ledgers deleted meanwhile are the ordinary path's. The check reads the metadata of every
ledger the node holds past the grace (pipelined, OVERREPLICATED_BATCH at a time, after a sync), never a listing
of the cluster, which is why it runs rarely.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Iterable

from metadata import layout, serde
from metadata.errors import MetadataConflictError, MetadataError, MetadataFormatError, NoSuchLedgerError
from metadata.model import LedgerMetadata, Versioned, over_replicated_on
from metadata.store import MetadataStore
from storage_node.storage import CompactionResult, Storage

_log = logging.getLogger(__name__)
# An exists request and its reply take about as many bytes as 8 names in a listing of /ledgers (some 120 bytes
# against 15), and ZooKeeper copies every name for a listing: the held ledgers are checked one by one while they
# are at most an 8th of the ledgers in metadata.
EXISTS_PER_NAME = 8
OVERREPLICATED_BATCH = 1000      # held ledgers whose metadata is read at once (pipelined), then dropped if garbage
METADATA_READ_SECONDS = 30.0     # a batch's reads are all answered within this, or the round does nothing more
OVERREPLICATED_RETRY_SECONDS = 600.0   # the most until a look for over-replicated ledgers that failed is made again


@dataclasses.dataclass(frozen=True)
class GcRound:
    ledgers_deleted: int
    compaction: CompactionResult | None
    overreplicated_deleted: int = 0
    # the round's look for over-replicated ledgers: "done", "off" (the cluster has not enabled it), "failed"
    # (ZooKeeper did not answer: the round compacted all the same), "" (not this round)
    overreplicated: str = ""


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


def overreplicated_ledgers(store: MetadataStore, ledger_ids: list[int],
                           node_id: str) -> list[Versioned[LedgerMetadata]]:
    """The ledgers among ledger_ids whose metadata is CLOSED and names node_id nowhere, as read (blocking: run in a
    thread). One sync, then a read of each (pipelined, METADATA_READ_SECONDS for all). A ledger not there is the
    ordinary path's (deleted_ledgers); one whose record cannot be decoded is kept. Raises MetadataError when
    ZooKeeper does not answer them all: the caller then drops nothing."""
    store.sync(layout.LEDGERS)
    paths = [layout.ledger_path(ledger_id) for ledger_id in ledger_ids]
    found = []
    for ledger_id, current in zip(ledger_ids, store.read_many_within(paths, bytes, METADATA_READ_SECONDS)):
        if current is None:
            continue
        try:
            meta = serde.decode_ledger(current.value)
        except MetadataFormatError as exc:
            _log.warning("ledger %d: its metadata cannot be decoded (%s); its copies here are kept", ledger_id, exc)
            continue
        if over_replicated_on(meta, node_id):
            found.append(Versioned(meta, current.version))
    return found


def advance_copy_drops(store: MetadataStore, found: list[Versioned[LedgerMetadata]]) -> list[int]:
    """Advance each ledger's copy_drops by one compare-and-set at the version read (blocking: run in a thread);
    the ledgers whose write landed. One that changed since it was read (a repair may have named this node) or was
    deleted is left. MetadataError (no answer, or a write whose reply was lost) raises: nothing is dropped."""
    touched = []
    for current in found:
        meta = current.value
        try:
            store.write_ledger(meta.with_copies_dropped(), current.version)
        except (MetadataConflictError, NoSuchLedgerError) as exc:
            _log.debug("ledger %d kept: %s", meta.ledger_id, exc)
            continue
        touched.append(meta.ledger_id)
    return touched


async def drop_overreplicated(store: MetadataStore, storage: Storage, node_id: str, grace: float) -> int | None:
    """Drop the copies of the held ledgers past the grace whose metadata is CLOSED and names node_id nowhere (the
    module's docstring says how, and why in that order); returns how many ledgers were dropped, None if the
    cluster has not enabled the feature (layout.COPY_DROPS: a cluster initialised by an older version, until
    `ledger init --enable copy-drops`)."""
    if not await asyncio.to_thread(store.exists, layout.COPY_DROPS):
        return None
    held = past_grace(storage, sorted(storage.ledgers), grace)
    dropped = 0
    for start in range(0, len(held), OVERREPLICATED_BATCH):
        found = await asyncio.to_thread(overreplicated_ledgers, store, held[start:start + OVERREPLICATED_BATCH],
                                        node_id)
        dropping = set(past_grace(storage, [current.value.ledger_id for current in found], grace))
        if not dropping:
            continue
        storage.refuse_adds(dropping)     # before the CAS: a copy that arrives after it finds the ledger refusing
        try:
            touched = await asyncio.to_thread(
                advance_copy_drops, store, [c for c in found if c.value.ledger_id in dropping])
            if touched:
                _log.debug("dropping over-replicated ledger(s) %s", touched)
                dropped += await storage.delete_ledgers(touched, over_replicated=True)
        finally:
            storage.allow_adds(dropping)
    return dropped


async def collect_garbage(store: MetadataStore, storage: Storage, compaction_threshold: float,
                          grace: float, overreplicated_of: str = "") -> GcRound:
    """One round: drop the ledgers deleted from metadata, then (overreplicated_of: this node's id) the
    over-replicated ones, then compact."""
    # What the node holds is taken before the listing: a ledger created after the listing is then
    # either not held yet or found by the re-check.
    held = past_grace(storage, sorted(storage.ledgers), grace)
    gone = await asyncio.to_thread(deleted_ledgers, store, held)
    # Checked again: a late writer may have re-created a ledger of that id meanwhile (a fresh state).
    gone = past_grace(storage, gone, grace)
    dropped = await storage.delete_ledgers(gone) if gone else 0
    overreplicated, how = 0, ""
    if overreplicated_of:
        try:
            found = await drop_overreplicated(store, storage, overreplicated_of, grace)
        except MetadataError as exc:   # a failed look must not cost the round its compaction
            _log.warning("looking for over-replicated ledgers failed, metadata unavailable: %s", exc)
            how = "failed"
        else:
            overreplicated, how = found or 0, "off" if found is None else "done"
    compaction = await storage.compact(compaction_threshold)
    return GcRound(dropped, compaction, overreplicated, how)


async def run_periodically(store: MetadataStore, storage: Storage, interval: float, compaction_threshold: float,
                           grace: float, node_id: str = "", overreplicated_interval: float = 0.0) -> None:
    """The node's garbage collector task; a failed round is logged and the next one tries again. Over-replicated
    ledgers of node_id are looked for in the first round and then every overreplicated_interval seconds (0: never);
    a look that failed is made again after OVERREPLICATED_RETRY_SECONDS at most (not every round: each reads the
    metadata of every ledger the node holds). While the cluster has not enabled the feature, each round asks
    whether it has (one exists request), so `ledger init --enable copy-drops` takes effect without a restart."""
    loop = asyncio.get_running_loop()
    next_overreplicated = loop.time()
    told_off = False
    while True:
        await asyncio.sleep(interval)
        check = node_id if overreplicated_interval and loop.time() >= next_overreplicated else ""
        try:
            done = await collect_garbage(store, storage, compaction_threshold, grace, overreplicated_of=check)
        except MetadataError as exc:
            _log.warning("garbage collection skipped this round, metadata unavailable: %s", exc)
            continue
        except Exception as exc:  # an I/O error or damaged record in a file to compact: keep serving
            _log.error("garbage collection round failed: %r", exc)
            if check:   # the look may have run before what failed: not again every round
                next_overreplicated = loop.time() + min(overreplicated_interval, OVERREPLICATED_RETRY_SECONDS)
            continue
        if check:
            retry = done.overreplicated == "failed"
            next_overreplicated = loop.time() + (min(overreplicated_interval, OVERREPLICATED_RETRY_SECONDS) if retry
                                                 else 0.0 if done.overreplicated == "off"   # one exists a round
                                                 else overreplicated_interval)
            if done.overreplicated == "off" and not told_off:
                _log.info("over-replicated ledgers are not collected: this cluster was initialised before nodes "
                          "dropped them; run `ledger init --enable copy-drops` once every `ledger audit` and "
                          "`ledger decommission` that may run, runs this version")
            told_off = done.overreplicated == "off"
        if done.ledgers_deleted or done.overreplicated_deleted or done.compaction.deleted:
            _log.info("garbage collection dropped %d deleted ledger(s) and %d over-replicated one(s) (CLOSED, their "
                      "metadata names this node nowhere), removed %d file(s), reclaimed %d bytes",
                      done.ledgers_deleted, done.overreplicated_deleted, len(done.compaction.deleted),
                      done.compaction.reclaimed_bytes)
