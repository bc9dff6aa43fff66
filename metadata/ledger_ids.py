"""Ledger ids: 63-bit, never handed out twice, however many ledgers a cluster creates over its life.

An id is taken from a ZooKeeper sequential znode (created and deleted at once). ZooKeeper numbers a parent's
sequential children with a signed 32-bit counter kept by the parent: after 2**31 ids it wraps to -2147483648 (at
200 ledgers a second, in 124 days), and a name parsed as a number would then give ids already used (a ledger id
used twice: nodes still holding a deleted ledger's entries, fence or master key under it, or a create failing).
So ids come in buckets, as BookKeeper's long id generator does:

| znode | ids |
| --- | --- |
| `/idgen/id-SEQ` (the first bucket, as every cluster has allocated from the start) | SEQ |
| `/idgen/bucket-B/id-SEQ` for B >= 1 | B * 2**31 + SEQ |

An allocator takes ids from the highest bucket; once a sequence reaches ROLL_AT (half the counter's range, so a
client still on the old bucket has a billion ids of headroom before the wrap) it creates the next bucket,
and a sequence number that is not in 0 .. 2**31-1 is never used. Buckets only ever grow, and every id of bucket B
is below every id of bucket B+1.

The sequential znodes are ephemeral: one left by a lost reply or a process that died between its create and its
delete goes with its session. Older versions created them persistent, and those leftovers stayed for good (every
new client lists /idgen on its first allocation): a store's first allocation removes some of the persistent ones
its listing found. Neither kind can make an id repeat: ZooKeeper numbers a parent's sequential children from the
parent's cversion, which every create of a child advances, whatever the child's mode and however it goes.
"""
from __future__ import annotations

import logging
import random
import re
import time

from metadata import layout
from metadata.errors import MetadataError

log = logging.getLogger(__name__)

SEQUENCE_BITS = 31
ROLL_AT = 1 << 30                     # a sequence at or past this makes the allocator open the next bucket
_BUCKET = "bucket-"
_BUCKET_NAME = re.compile(r"bucket-(\d{10})")
_SEQUENCE = re.compile(r"\d{10}")     # ZooKeeper's "%010d" of a non-negative counter; a wrapped one has a '-'
_ID = "id-"
# A persistent id znode younger than this may be an older version's allocation in flight (between its create and
# its delete): it is left alone. Counted by this host's clock against the znode's ctime (ZooKeeper's clock).
LEFTOVER_GRACE = 600.0
LEFTOVERS_PER_STORE = 100   # persistent leftovers one store's first allocation looks at, at most


def bucket_path(bucket: int) -> str:
    """The parent of bucket's sequential znodes (the first bucket is /idgen itself)."""
    return layout.IDGEN if bucket == 0 else f"{layout.IDGEN}/{_BUCKET}{bucket:010d}"


def sequence_of(created_path: str) -> int | None:
    """The sequence number ZooKeeper gave a created `.../id-` znode; None once its counter has wrapped."""
    suffix = created_path.rsplit("/id-", 1)[1]
    return int(suffix) if _SEQUENCE.fullmatch(suffix) else None


def ledger_id(bucket: int, sequence: int) -> int:
    if not 0 <= sequence < 1 << SEQUENCE_BITS:
        raise ValueError(f"sequence {sequence} is outside 0..2**{SEQUENCE_BITS}-1")
    return (bucket << SEQUENCE_BITS) | sequence


def _ids_among(parent: str, children: list[str]) -> list[str]:
    return [f"{parent}/{name}" for name in children if name.startswith(_ID)]


def highest_bucket(idgen_children: list[str]) -> int:
    """The highest bucket named among /idgen's children (0 when none was opened yet)."""
    return max((int(m.group(1)) for name in idgen_children if (m := _BUCKET_NAME.fullmatch(name))), default=0)


class LedgerIds:
    """A store's allocator: remembers the highest bucket it knows, opens the next one when this one is used up.

    Several allocators (every client) may open the same bucket at once: creating it is idempotent, and each
    takes the highest bucket listed afterwards, so they all move on."""

    def __init__(self, store, roll_at: int = ROLL_AT, leftover_grace: float = LEFTOVER_GRACE):
        self._store = store
        self._roll_at = roll_at
        self._leftover_grace = leftover_grace
        self._bucket: int | None = None
        self._leftovers: list[str] = []    # id znodes the first listing found, looked at after the first ids

    def take(self, count: int, per_request: int) -> list[int]:
        """count new ids, in increasing order: one create and one delete per id (a multi of per_request of each
        when count > 1)."""
        ids: list[int] = []
        while len(ids) < count:
            bucket = self._current()
            paths = self._created(bucket, min(per_request, count - len(ids)))
            sequences = [sequence_of(path) for path in paths]
            ids += [ledger_id(bucket, s) for s in sequences if s is not None]
            if any(s is None or s >= self._roll_at for s in sequences):
                self._open_next(bucket)
        if self._leftovers:
            self._remove_leftovers()
        return ids

    def _current(self) -> int:
        if self._bucket is None:
            children = self._store.children(layout.IDGEN)
            self._bucket = highest_bucket(children)
            self._leftovers = _ids_among(layout.IDGEN, children)
            if self._bucket > 0:
                path = bucket_path(self._bucket)
                self._leftovers += _ids_among(path, self._store.children(path))
        return self._bucket

    def _remove_leftovers(self) -> None:
        """Delete the persistent id znodes (an older version's leftovers) among those the first listing found,
        once the grace has passed since their creation: a random sample of at most LEFTOVERS_PER_STORE, so that
        clients starting together share the work, and each store's is bounded. Ephemeral ones are allocations in
        flight, or leftovers their session's end removes. Best effort: the ids are taken, and the next store's
        first allocation looks again."""
        found, self._leftovers = self._leftovers, []
        sample = random.sample(found, min(len(found), LEFTOVERS_PER_STORE))
        try:
            stats = self._store.stats(sample)
            now = time.time()
            for path, stat in zip(sample, stats):
                if stat is not None and stat.ephemeralOwner == 0 and now - stat.ctime / 1000 >= self._leftover_grace:
                    self._store.delete(path)
        except MetadataError as exc:
            log.warning("leftover ledger id znodes under %s not removed (a later client tries again): %s",
                        layout.IDGEN, exc)

    def _created(self, bucket: int, count: int) -> list[str]:
        return self._store.sequence_names(f"{bucket_path(bucket)}/{_ID}", count)

    def _open_next(self, bucket: int) -> None:
        self._store.ensure_path(bucket_path(bucket + 1))
        self._bucket = max(bucket + 1, highest_bucket(self._store.children(layout.IDGEN)))
