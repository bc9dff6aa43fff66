"""Streaming queries' commit records: the last micro-batch each query committed to a stream, one znode per query
beside the stream's head.

    /streams/NAME/queries/QUERY   {"batch": N}   (QUERY: the query id, quoted)

The exactly-once sink (connector/spark/stream_write.py) reads its query's record with the head, and its commit
writes both in one multi (streams.Rewrite's `also`): the batch's ledgers join the tail and the record says the
batch is committed, together or not at all (DESIGN rule 16). A batch that Spark replays after a restart finds its
batch id there and is skipped; a commit whose reply was lost reads the record back and finds itself. A commit
reads and writes its own query's record only, so neither the head nor a commit grows with the number of queries
that ever wrote to the stream (rule 15).

The records stay bounded: after a commit that created a record (a query's first, or one that moved an older
head's records out), once there are more than KEPT, the least recently committed are deleted down to LOW_WATER
(evict), so the records are looked through once per KEPT - LOW_WATER new queries. An evicted query that comes
back to replay the batch it committed last (Spark replays the last batch of a run that died between the sink's
commit and its own commit log) finds no record and writes that batch a second time; that takes LOW_WATER other
queries committing to the same stream between its last commit and its restart.

Heads written by older software hold these records in the head itself (StreamRecord.commits, least recently
committed first). They count too (the larger batch id wins), and the next commit of any query moves the newest
KEPT - 1 of them out into znodes in its multi (the older ones are dropped, as eviction would drop them).
"""
from __future__ import annotations

import dataclasses
import json
import logging

from kazoo.exceptions import BadVersionError, NoNodeError

from metadata import layout
from metadata.errors import LedgerError
from metadata.model import StreamRecord
from metadata.store import MetadataStore
from metadata.streams import ZnodeWrite

log = logging.getLogger(__name__)

KEPT = 1000       # streaming queries whose last batch a stream keeps at most (see the module docstring)
LOW_WATER = 900   # what an eviction leaves


@dataclasses.dataclass(frozen=True)
class QueryCommit:
    """A query's commit record as read with a stream's head: the batch id and version of its znode (None: it has
    none), the head's own record of the query (written by older software; None: none), and the writes that move
    the head's other records out (read with it, when the head holds any)."""

    query_id: str
    batch_id: int | None
    version: int | None
    in_head: int | None = None
    moved_out: tuple[ZnodeWrite, ...] = ()

    @property
    def last_batch(self) -> int | None:
        known = [batch for batch in (self.batch_id, self.in_head) if batch is not None]
        return max(known) if known else None

    def holds(self, batch_id: int) -> bool:
        """Whether the query committed batch_id (or a later batch) to the stream."""
        last = self.last_batch
        return last is not None and last >= batch_id


def read_query_commit(store: MetadataStore, head: StreamRecord, query_id: str) -> QueryCommit:
    found = store.read(layout.stream_query_path(head.name, query_id), decode_batch)
    return QueryCommit(query_id, None if found is None else found.value, None if found is None else found.version,
                       head.committed_batch(query_id), _moved_out(store, head, query_id) if head.commits else ())


def committing(head: StreamRecord, commit: QueryCommit, batch_id: int) -> tuple[StreamRecord, tuple[ZnodeWrite, ...]]:
    """What the commit of commit.query_id's batch_id writes besides the head's tail: the head without the records
    of older software, and the znode writes of its multi: the query's record set to batch_id (created if it has
    none) and the head's other records moved out."""
    record = (layout.stream_query_path(head.name, commit.query_id), encode_batch(batch_id), commit.version)
    return head.replace(commits=()), (record,) + commit.moved_out


def _moved_out(store: MetadataStore, head: StreamRecord, skip: str) -> tuple[ZnodeWrite, ...]:
    """The writes that move the newest KEPT - 1 of the head's records (older software) into znodes: a create where
    a query has none, a raise where its znode holds an older batch (the larger batch id counts)."""
    present = set(_children(store, head.name))
    writes: list[ZnodeWrite] = []
    for query_id, batch_id in [entry for entry in head.commits if entry[0] != skip][-(KEPT - 1):]:
        path = layout.stream_query_path(head.name, query_id)
        found = store.read(path, decode_batch) if path.rsplit("/", 1)[1] in present else None
        if found is None:
            writes.append((path, encode_batch(batch_id), None))
        elif found.value < batch_id:
            writes.append((path, encode_batch(batch_id), found.version))
    return tuple(writes)


def query_commits(store: MetadataStore, head: StreamRecord) -> list[tuple[str, int]]:
    """(query id, last batch) of every query with a record on the stream, least recently committed first. Reads
    every record (for `ledger stream show`, not a commit's path)."""
    found: dict[str, tuple[int, int]] = {query_id: (-1, batch_id) for query_id, batch_id in head.commits}
    for name in _children(store, head.name):
        record = store.read_with_stat(f"{layout.stream_queries_path(head.name)}/{name}", decode_batch)
        if record is None:
            continue  # evicted meanwhile
        batch_id, stat = record
        query_id = layout.query_id_from_name(name)
        in_head = found.get(query_id, (-1, batch_id))[1]
        found[query_id] = (stat.mzxid, max(batch_id, in_head))
    return [(query_id, batch_id) for query_id, (_, batch_id) in sorted(found.items(), key=lambda item: item[1][0])]


def evict(store: MetadataStore, name: str, spare: str, kept: int | None = None, low_water: int | None = None) -> int:
    """When the stream has more than `kept` query records (default KEPT), delete the least recently committed (by
    the zxid of their last write) down to `low_water` (default LOW_WATER), never the record at path `spare` (the
    one the caller just wrote); how many it deleted. A record committed again meanwhile stays (the delete is
    conditional on the version read). Never raises: what is left over goes with a later eviction."""
    kept = KEPT if kept is None else kept
    low_water = LOW_WATER if low_water is None else low_water
    try:
        stat = store.stat(layout.stream_queries_path(name))
        if stat is None or stat.numChildren <= kept:
            return 0
        records = []
        for child in _children(store, name):
            path = f"{layout.stream_queries_path(name)}/{child}"
            child_stat = store.stat(path) if path != spare else None
            if child_stat is not None:
                records.append((child_stat.mzxid, path, child_stat.version))
        records.sort()
        deleted = 0
        for _, path, version in records[:max(0, stat.numChildren - low_water)]:
            request = store.transaction()
            request.delete(path, version)
            try:
                request.commit()
                deleted += 1
            except (NoNodeError, BadVersionError):
                pass  # deleted, or committed again, meanwhile
        return deleted
    except LedgerError as exc:
        log.warning("stream %r: old query commit records not deleted (a later query's first commit will): %s",
                    name, exc)
        return 0


def _children(store: MetadataStore, name: str) -> list[str]:
    try:
        return store.children(layout.stream_queries_path(name))
    except NoNodeError:
        return []   # a stream created before query records had znodes, none written yet


def encode_batch(batch_id: int) -> bytes:
    return json.dumps({"batch": batch_id}).encode()


def decode_batch(data: bytes) -> int:
    return int(json.loads(data)["batch"])
