"""JSON encoding of metadata records, each tagged with a format version."""
from __future__ import annotations

import json
from typing import Any

from metadata.errors import MetadataFormatError
from metadata.model import (
    ByteCount,
    Cookie,
    Fragment,
    LedgerMetadata,
    LedgerState,
    NodeRegistration,
    NodeState,
    Retention,
    Shelf,
    StreamBook,
    StreamLedger,
    StreamRecord,
)

FORMAT_VERSION = 1
# Version 2 of a stream record is the head of a paged stream (its tail; older ledgers in pages); version 1
# held every ledger in one record and is read as a head whose tail is all of them (migrated on write).
# Version 3: streaming queries' commit records are znodes beside the head (metadata/query_commits.py), which
# software that reads version 2 would not look at, so it must not read such a head (it could commit a replayed
# batch twice); `commits` holds only records not yet moved out of an older head.
# Version 4: new pages are sealed into books (/streams/NAME/books/BOOK/PAGE, the head's `shelf` says where the
# next goes), which software that reads version 3 would not look at (and it would seal flat pages after them).
STREAM_FORMAT_VERSION = 4
# Version 5: a head `ledger stream delete` marked deleting; written as such so that no reader of version 4 (the
# software of the same day before the mark existed) takes the stream for a live one and writes the mark away.
DELETING_FORMAT_VERSION = 5


def _dump(kind: str, body: dict[str, Any], version: int = FORMAT_VERSION) -> bytes:
    record = {"format_version": version, "kind": kind, **body}
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def _load(kind: str, data: bytes, versions: tuple[int, ...] = (FORMAT_VERSION,)) -> dict[str, Any]:
    try:
        record = json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MetadataFormatError(f"damaged {kind} record in ZooKeeper: {exc}") from exc
    version = record.get("format_version") if isinstance(record, dict) else None
    if version not in versions:
        raise MetadataFormatError(
            f"{kind} record has format version {version!r}, this software reads version "
            f"{' or '.join(map(str, versions))}; upgrade the software that reads it"
        )
    if record.get("kind") != kind:
        raise MetadataFormatError(f"expected a {kind} record, found {record.get('kind')!r}")
    return record


def encode_ledger(meta: LedgerMetadata) -> bytes:
    body = {
        "ledger_id": meta.ledger_id,
        "ensemble_size": meta.ensemble_size,
        "write_quorum": meta.write_quorum,
        "ack_quorum": meta.ack_quorum,
        "state": meta.state.value,
        "last_entry_id": meta.last_entry_id,
        "length": meta.length,
        "fragments": [[f.first_entry_id, list(f.ensemble)] for f in meta.fragments],
        "digest_type": meta.digest_type,
        "password_hash": meta.password_hash,
        "custom_metadata": dict(meta.custom_metadata),
        "writer_id": meta.writer_id,
        "created_at": meta.created_at,
    }
    # Written only once a node dropped copies: a record without it reads as none dropped (older records too).
    if meta.copy_drops:
        body["copy_drops"] = meta.copy_drops
    return _dump("ledger", body)


def decode_ledger(data: bytes) -> LedgerMetadata:
    r = _load("ledger", data)
    return LedgerMetadata(
        ledger_id=r["ledger_id"],
        ensemble_size=r["ensemble_size"],
        write_quorum=r["write_quorum"],
        ack_quorum=r["ack_quorum"],
        state=LedgerState(r["state"]),
        last_entry_id=r["last_entry_id"],
        length=r["length"],
        fragments=tuple(Fragment(first, tuple(ensemble)) for first, ensemble in r["fragments"]),
        digest_type=r["digest_type"],
        password_hash=r["password_hash"],
        custom_metadata=tuple(sorted(r["custom_metadata"].items())),
        writer_id=r["writer_id"],
        created_at=r["created_at"],
        copy_drops=r.get("copy_drops", 0),
    )


def encode_node(reg: NodeRegistration) -> bytes:
    return _dump(
        "node",
        {
            "node_id": reg.node_id,
            "address": reg.address,
            "state": reg.state.value,
            "data_dir": reg.data_dir,
            "pid": reg.pid,
            "metrics_address": reg.metrics_address,
            "read_only_reason": reg.read_only_reason,
            "disk_used_bytes": reg.disk_used_bytes,
            "disk_capacity_bytes": reg.disk_capacity_bytes,
            "disk_fill": reg.disk_fill,
            "health": reg.health,
        },
    )


def decode_node(data: bytes) -> NodeRegistration:
    r = _load("node", data)
    return NodeRegistration(
        node_id=r["node_id"],
        address=r["address"],
        state=NodeState(r["state"]),
        data_dir=r["data_dir"],
        pid=r["pid"],
        # Fields added later: a registration written by an older node lacks them.
        metrics_address=r.get("metrics_address", ""),
        read_only_reason=r.get("read_only_reason", ""),
        disk_used_bytes=r.get("disk_used_bytes", 0),
        disk_capacity_bytes=r.get("disk_capacity_bytes", 0),
        disk_fill=r.get("disk_fill", 0.0),
        health=r.get("health", ""),
    )


def encode_cookie(cookie: Cookie) -> bytes:
    return _dump(
        "cookie",
        {
            "node_id": cookie.node_id,
            "instance_id": cookie.instance_id,
            "data_dir": cookie.data_dir,
            "created_at": cookie.created_at,
        },
    )


def decode_cookie(data: bytes) -> Cookie:
    r = _load("cookie", data)
    return Cookie(r["node_id"], r["instance_id"], r["data_dir"], r["created_at"])


def encode_stream(stream: StreamRecord) -> bytes:
    body = {
        "name": stream.name,
        "format": stream.format,
        "schema": stream.schema,
        "tail": _ledger_rows(stream.tail),
        "jobs": [[job_id, outcome] for job_id, outcome in stream.jobs],
        "first_offset": stream.first_offset,
        "page_generation": stream.page_generation,
        "owner": stream.owner,
        "created_at": stream.created_at,
    }
    # Optional fields, written only when set: a head without them reads as no retention, nothing counted, no
    # commit records in the head.
    if stream.commits:
        body["commits"] = [[query_id, batch_id] for query_id, batch_id in stream.commits]
    if stream.retention.is_set:
        body["retention"] = {"max_age": stream.retention.max_age, "max_bytes": stream.retention.max_bytes}
    if stream.byte_count is not None:
        count = stream.byte_count
        body["byte_count"] = [count.first_offset, count.end_offset, count.bytes]
    if stream.shelf is not None:
        shelf = stream.shelf
        book = shelf.book
        body["shelf"] = {"book": None if book is None else [book.ordinal, book.first_offset, book.max_ledger_id],
                         "pages": shelf.pages, "next": shelf.next_ordinal, "max": shelf.max_ledger_id}
    if stream.deleting:
        body["deleting"] = True
    return _dump("stream", body, DELETING_FORMAT_VERSION if stream.deleting else STREAM_FORMAT_VERSION)


def _shelf(raw: dict | None) -> Shelf | None:
    if raw is None:
        return None
    book = None if raw["book"] is None else StreamBook(*raw["book"])
    return Shelf(book, raw["pages"], raw["next"], raw["max"])


def decode_stream(data: bytes) -> StreamRecord:
    r = _load("stream", data, (1, 2, 3, STREAM_FORMAT_VERSION, DELETING_FORMAT_VERSION))
    if r["format_version"] == 1:
        tail = _ledgers(r["ledgers"])
        commits = sorted(r["commits"].items())
        first_offset = tail[0].first_offset if tail else r.get("base_offset", 0)
    else:
        tail = _ledgers(r["tail"])
        commits = [(query_id, batch_id) for query_id, batch_id in r.get("commits", ())]
        first_offset = r["first_offset"]
    return StreamRecord(
        name=r["name"],
        format=r["format"],
        schema=r["schema"],
        tail=tail,
        commits=tuple(commits),
        owner=r["owner"],
        created_at=r["created_at"],
        jobs=tuple((job_id, outcome) for job_id, outcome in r.get("jobs", ())),
        first_offset=first_offset,
        page_generation=r.get("page_generation", 0),
        retention=Retention(**r["retention"]) if "retention" in r else Retention(),
        byte_count=ByteCount(*r["byte_count"]) if "byte_count" in r else None,
        shelf=_shelf(r.get("shelf")),
        deleting=r.get("deleting", False),
    )


def encode_page(ledgers: tuple[StreamLedger, ...]) -> bytes:
    return _dump("stream-page", {"ledgers": _ledger_rows(ledgers)})


def decode_page(data: bytes) -> tuple[StreamLedger, ...]:
    return _ledgers(_load("stream-page", data)["ledgers"])


def _ledger_rows(ledgers: tuple[StreamLedger, ...]) -> list[list[int | None]]:
    return [[s.ledger_id, s.first_offset, s.last_offset] for s in ledgers]


def _ledgers(rows: list) -> tuple[StreamLedger, ...]:
    return tuple(StreamLedger(ledger_id, first, last) for ledger_id, first, last in rows)
