"""Streams of closed ledgers built through the metadata API: ledger metadata (closed, with a length) and commits
that register them, no entries written. For what reads only metadata: truncation, retention, read planning."""
from __future__ import annotations

import time

from metadata import layout, serde, streams
from metadata.model import Fragment, LedgerMetadata, LedgerState, StreamLedger, StreamRecord
from metadata.store import MetadataStore
from metadata.streams import PAGE_LEDGERS

OFFSETS = 10   # offsets (raw entries) per fixture ledger
PER_MULTI = 500


def closed_ledgers(store: MetadataStore, count: int, length: int = 100) -> list[int]:
    """count closed ledgers of OFFSETS entries and `length` bytes each, created PER_MULTI to a ZooKeeper multi."""
    ids = store.allocate_ledger_ids(count)
    for start in range(0, count, PER_MULTI):
        request = store.transaction()
        for ledger_id in ids[start:start + PER_MULTI]:
            meta = LedgerMetadata(ledger_id, 3, 3, 2, (Fragment(0, ("a", "b", "c")),), state=LedgerState.CLOSED,
                                  last_entry_id=OFFSETS - 1, length=length, created_at=time.time())
            request.create(layout.ledger_path(ledger_id), serde.encode_ledger(meta))
        request.commit()
    return ids


def appended(store: MetadataStore, name: str, ids: list[int]) -> StreamRecord:
    """The ledgers committed onto the stream (created raw if new), PAGE_LEDGERS at a time, as commits add them;
    returns the head after."""
    for start in range(0, len(ids), PAGE_LEDGERS):
        def add(record: StreamRecord, chunk=ids[start:start + PAGE_LEDGERS]) -> StreamRecord:
            offset = record.next_offset
            return record.replace(tail=record.tail + tuple(
                StreamLedger(i, offset + n * OFFSETS, offset + (n + 1) * OFFSETS - 1) for n, i in enumerate(chunk)))
        streams.update_stream(store, name, add, create=StreamRecord(name, "raw"))
    return streams.read_stream(store, name).value


def without_created(offset: dict) -> dict:
    """A source offset without the stream's creation time (a stream created in a test has one of its own) and the
    id of the OPEN ledger it stands in."""
    return {key: value for key, value in offset.items() if key not in ("created", "ledger")}


def delete_head(store: MetadataStore, name: str) -> None:
    """The stream's head and pages deleted as `ledger stream delete` deletes them (marked first; its ledgers
    stay)."""
    streams.mark_deleting(store, name)
    assert streams.delete_stream(store, name)
