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
"""
from __future__ import annotations

import re

from metadata import layout

SEQUENCE_BITS = 31
ROLL_AT = 1 << 30                     # a sequence at or past this makes the allocator open the next bucket
_BUCKET = "bucket-"
_BUCKET_NAME = re.compile(r"bucket-(\d{10})")
_SEQUENCE = re.compile(r"\d{10}")     # ZooKeeper's "%010d" of a non-negative counter; a wrapped one has a '-'


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


def highest_bucket(idgen_children: list[str]) -> int:
    """The highest bucket named among /idgen's children (0 when none was opened yet)."""
    return max((int(m.group(1)) for name in idgen_children if (m := _BUCKET_NAME.fullmatch(name))), default=0)


class LedgerIds:
    """A store's allocator: remembers the highest bucket it knows, opens the next one when this one is used up.

    Several allocators (every client) may open the same bucket at once: creating it is idempotent, and each
    takes the highest bucket listed afterwards, so they all move on."""

    def __init__(self, store, roll_at: int = ROLL_AT):
        self._store = store
        self._roll_at = roll_at
        self._bucket: int | None = None

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
        return ids

    def _current(self) -> int:
        if self._bucket is None:
            self._bucket = highest_bucket(self._store.children(layout.IDGEN))
        return self._bucket

    def _created(self, bucket: int, count: int) -> list[str]:
        return self._store.sequence_names(f"{bucket_path(bucket)}/id-", count)

    def _open_next(self, bucket: int) -> None:
        self._store.ensure_path(bucket_path(bucket + 1))
        self._bucket = max(bucket + 1, highest_bucket(self._store.children(layout.IDGEN)))
