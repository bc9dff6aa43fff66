"""The data model of DESIGN section 3 as frozen dataclasses; updates return changed copies."""
from __future__ import annotations

import dataclasses
import enum
from typing import Generic, Mapping, TypeVar

T = TypeVar("T")


class LedgerState(str, enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


@dataclasses.dataclass(frozen=True)
class Fragment:
    """Entries from first_entry_id on (until the next fragment) are striped over ensemble."""

    first_entry_id: int
    ensemble: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class LedgerMetadata:
    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    fragments: tuple[Fragment, ...]
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length: int = 0
    digest_type: str = "CRC32C"
    password_hash: str = ""
    custom_metadata: tuple[tuple[str, str], ...] = ()
    writer_id: str = ""
    created_at: float = 0.0
    # How many times a storage node dropped its copies of this ledger as over-replicated (over_replicated_on):
    # each drop advances it in the compare-and-set that precedes it, and a re-replication stores the copies it made
    # only while it is as the repair read it before copying (connector/client/replication.py replace_in_fragment),
    # so copies a node may have dropped since are never named in the metadata.
    copy_drops: int = 0

    @property
    def custom(self) -> dict[str, str]:
        return dict(self.custom_metadata)

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    @property
    def last_fragment(self) -> Fragment:
        return self.fragments[-1]

    def fragment_for(self, entry_id: int) -> Fragment:
        """The fragment whose ensemble stores entry_id."""
        chosen = self.fragments[0]
        for fragment in self.fragments:
            if fragment.first_entry_id <= entry_id:
                chosen = fragment
            else:
                break
        return chosen

    def ensemble_for(self, entry_id: int) -> tuple[str, ...]:
        return self.fragment_for(entry_id).ensemble

    def fragment_ranges(self) -> list[tuple[int, int, Fragment]]:
        """(first, last, fragment) for every fragment; last is -1 past the end for an open ledger."""
        ranges = []
        for index, fragment in enumerate(self.fragments):
            if index + 1 < len(self.fragments):
                last = self.fragments[index + 1].first_entry_id - 1
            else:
                last = self.last_entry_id if self.is_closed else -1
            ranges.append((fragment.first_entry_id, last, fragment))
        return ranges

    def all_nodes(self) -> set[str]:
        return {node for fragment in self.fragments for node in fragment.ensemble}

    def replace(self, **changes) -> "LedgerMetadata":
        return dataclasses.replace(self, **changes)

    def with_ensemble_from(self, first_entry_id: int, ensemble: tuple[str, ...]) -> "LedgerMetadata":
        """Rule 3: a new fragment from first_entry_id, replacing the last one if it starts there."""
        kept = tuple(f for f in self.fragments if f.first_entry_id < first_entry_id)
        return self.replace(fragments=kept + (Fragment(first_entry_id, tuple(ensemble)),))

    def closed_at(self, last_entry_id: int, length: int) -> "LedgerMetadata":
        return self.replace(state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length)

    def with_copies_dropped(self) -> "LedgerMetadata":
        """The record a node writes, at the version it read, before it drops its over-replicated copies."""
        return self.replace(copy_drops=self.copy_drops + 1)


def over_replicated_on(meta: LedgerMetadata, node_id: str) -> bool:
    """Whether node_id's copies of the ledger are garbage (BookKeeper's over-replicated ledgers): the ledger is
    CLOSED and no fragment names the node. Once CLOSED no writer adds to it; what still reaches a node is a
    re-replication's copies (stored in the metadata only by a compare-and-set after them, which checks copy_drops)
    and a losing recovery's write-back (whose close found the ledger closed and stored nothing). An OPEN or
    IN_RECOVERY ledger is never garbage anywhere: its writer's or recovery's ensemble may still name the node."""
    return meta.is_closed and node_id not in meta.all_nodes()


def make_custom_metadata(values: Mapping[str, object] | None) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), str(v)) for k, v in (values or {}).items()))


@dataclasses.dataclass(frozen=True)
class Versioned(Generic[T]):
    """A record with the ZooKeeper znode version it was read at, for compare-and-set."""

    value: T
    version: int


class NodeState(str, enum.Enum):
    AVAILABLE = "available"
    READ_ONLY = "read_only"


HEALTH_OK = "ok"


@dataclasses.dataclass(frozen=True)
class NodeRegistration:
    """What a storage node publishes about itself in its ephemeral znode (`ledger nodes` lists it).

    A node whose journal broke (a failed fsync: it serves nothing until restarted) registers as READ_ONLY,
    so that no ensemble picks it, with health "broken: <why>"; the state enum stays the one older clients
    can decode. The disk fields: bytes its data directory takes, the capacity it judges its fill by (its
    --disk-quota-bytes, else the filesystem's size) and that fill (what --read-only-threshold applies to).
    Registrations written before these fields existed read as "" / 0 (unknown).
    """

    node_id: str
    address: str
    state: NodeState = NodeState.AVAILABLE
    data_dir: str = ""
    pid: int = 0
    metrics_address: str = ""
    read_only_reason: str = ""
    disk_used_bytes: int = 0
    disk_capacity_bytes: int = 0
    disk_fill: float = 0.0
    health: str = ""           # HEALTH_OK, "broken: ...", or "" from a node too old to say

    @property
    def broken(self) -> bool:
        return self.health.startswith("broken")


@dataclasses.dataclass(frozen=True)
class Cookie:
    """A storage node's identity, kept both in ZooKeeper and in its data directory."""

    node_id: str
    instance_id: str
    data_dir: str
    created_at: float


@dataclasses.dataclass(frozen=True)
class StreamLedger:
    """A ledger in a stream, covering offsets first_offset..last_offset (inclusive).

    last_offset is None while the ledger is OPEN (its end is not known yet).
    """

    ledger_id: int
    first_offset: int
    last_offset: int | None = None

    @property
    def empty(self) -> bool:
        """Sealed without entries (its owner died before appending): it covers no offset."""
        return self.last_offset is not None and self.last_offset < self.first_offset


@dataclasses.dataclass(frozen=True)
class StreamBook:
    """A book of a stream's sealed pages, as its znode name K-F-P tells it (metadata/streams.py): the stream's
    K-th book (numbered from 0 as they are created), holding its pages from offset F up to the next book's F
    (the newest book: up to the tail). P is the highest ledger id in the stream's pages when the book was
    created (-1: none): no ledger with a higher id was sealed into the books before it (or the flat pages)."""

    ordinal: int
    first_offset: int
    max_ledger_id: int


@dataclasses.dataclass(frozen=True)
class StreamPage:
    """A sealed page of a stream, as its znode name tells it: closed ledgers covering offsets first_offset..
    last_offset, the highest of their ids max_ledger_id (a ledger with a higher id cannot be in it).

    generation is 0 for a page sealed off the tail; a compaction's rewritten pages carry the head's new
    page_generation, and the pages they replace stay until its grace period has passed (metadata/streams.py).
    book is the book the page is in, None for a flat page (directly under /streams/NAME/pages, as software
    before books sealed them).
    """

    first_offset: int
    last_offset: int
    max_ledger_id: int
    generation: int = 0
    book: StreamBook | None = None


@dataclasses.dataclass(frozen=True)
class Shelf:
    """Where a stream's next sealed page goes, kept in its head: into `book`, which holds `pages` pages sealed
    off the tail so far, or (book None) into a new book of ordinal next_ordinal, created in the multi that
    seals its first page. max_ledger_id is the highest ledger id put into the stream's pages so far (the next
    book's P), -1 if none."""

    book: StreamBook | None = None
    pages: int = 0
    next_ordinal: int = 0
    max_ledger_id: int = -1


@dataclasses.dataclass(frozen=True)
class Retention:
    """A stream's retention: its closed ledgers older than max_age seconds go, and its oldest ones while the
    closed ledgers hold more than max_bytes (None: no such limit). Only whole ledgers leave, from the front
    (connector/retention.py)."""

    max_age: float | None = None
    max_bytes: int | None = None

    @property
    def is_set(self) -> bool:
        return self.max_age is not None or self.max_bytes is not None

    def updated(self, max_age: float | None = None, max_bytes: int | None = None) -> "Retention":
        """This retention with the limits given changed: a limit replaces the one set, a negative one removes it
        (as Kafka's retention.ms=-1), None keeps it."""
        def pick(new, old):
            return old if new is None else (None if new < 0 else new)
        return Retention(pick(max_age, self.max_age), pick(max_bytes, self.max_bytes))


@dataclasses.dataclass(frozen=True)
class ByteCount:
    """What retention by size counted: the closed ledgers holding offsets first_offset..end_offset - 1 hold
    `bytes` (their lengths). Valid while the stream still starts at first_offset; a rewrite of counted
    offsets (a compaction) adjusts it in its swap (connector/compaction.py; streams.replace_run alone drops it,
    and retention counts again)."""

    first_offset: int
    end_offset: int
    bytes: int


def recreated_since(offset_created: float, created: float) -> bool:
    """Whether a stream created at `created` was deleted and created again since an offset stamped with
    offset_created was read from it (a Spark source's offset carries its stream's creation time): offsets of the
    old stream mean nothing in the new one, whose offsets started again at 0. Both must be known (an offset, or
    a stream, written by an older version carries none: 0)."""
    return bool(offset_created and created and offset_created != created)


@dataclasses.dataclass(frozen=True)
class StreamRecord:
    """The head of a stream (a segmented log): its format, schema, owner, Spark commit records, where its
    offsets start, and its tail, the most recent ledgers. The stream's older ledgers are in sealed pages
    (see metadata/streams.py), so the head stays small however long the stream lives (DESIGN rule 15).

    The tail always holds the stream's last ledger (the one an owner may have OPEN) unless the stream holds
    no ledger. Offsets below first_offset are gone (overwritten, or truncated): readers skip them, and a
    stream that holds no ledger hands out first_offset next, so offsets only grow (rule 17).

    The commit records make the outcome of a Spark commit knowable (DESIGN rule 16): `jobs` holds the outcome
    ("committed" or "aborted") of the most recent batch write jobs, oldest first, bounded by the connector (see
    connector/spark/commit.py). A streaming query's last committed batch is in a znode of its own beside the head
    (metadata/query_commits.py); `commits` holds such records only in heads written by older software (the last
    batch id per query, least recently committed first), and the next streaming commit moves them out.

    page_generation counts the compactions that rewrote pages: a reader of this head reads, for each offset,
    the page of the highest generation up to it (see metadata/streams.py).

    retention is the stream's retention setting, byte_count what retention by size counted so far (so that a
    run reads only the ledgers added since, and those it removes).

    shelf says where the next sealed page goes; None in a head written by software before books, whose stream
    may have flat pages (its first seal into a book looks up their highest ledger id, once).

    deleting is set by `ledger stream delete` in its first compare-and-set: from then on the stream is gone to
    every reader and writer (metadata/streams.find_stream answers None), while its pages and ledgers are deleted.
    """

    name: str
    format: str = "raw"
    schema: str = ""
    tail: tuple[StreamLedger, ...] = ()
    commits: tuple[tuple[str, int], ...] = ()
    owner: str = ""
    created_at: float = 0.0
    jobs: tuple[tuple[str, str], ...] = ()
    first_offset: int = 0
    page_generation: int = 0
    retention: Retention = Retention()
    byte_count: ByteCount | None = None
    shelf: Shelf | None = None
    deleting: bool = False

    @property
    def next_offset(self) -> int:
        last = self.last_ledger
        if last is None:
            return self.first_offset
        if last.last_offset is None:
            raise ValueError(f"stream {self.name!r}: ledger {last.ledger_id} is still open")
        return last.last_offset + 1

    @property
    def last_ledger(self) -> StreamLedger | None:
        return self.tail[-1] if self.tail else None

    @property
    def tail_offset(self) -> int:
        """Where the tail starts: the stream's offsets from first_offset up to here are in sealed pages."""
        return self.tail[0].first_offset if self.tail else self.first_offset

    def committed_batch(self, writer: str) -> int | None:
        return dict(self.commits).get(writer)

    def replace(self, **changes) -> "StreamRecord":
        return dataclasses.replace(self, **changes)
