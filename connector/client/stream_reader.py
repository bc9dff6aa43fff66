"""Reading a stream in offset order across its ledgers, including the OPEN tail of a live writer up to
its last add confirmed (never past it: entries beyond the LAC may still be lost or rewritten).

Each entry comes with its payload as written and its append time (ReadHandle.read strips the time frame,
entry_time.py); entries of ledgers written before entry times existed have time_ms None.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

from connector.client.api import LedgerClient
from metadata import streams
from metadata.model import StreamLedger


@dataclasses.dataclass(frozen=True)
class StreamEntry:
    offset: int
    ledger_id: int
    entry_id: int
    payload: bytes
    time_ms: int | None = None   # the writer's append time, ms since the epoch; None: written without times


def read_stream(
    client: LedgerClient, name: str, start: int = 0, end: int | None = None, password: bytes = b""
) -> Iterator[StreamEntry]:
    """Entries with start <= offset <= end (end None: up to what is readable now), in offset order."""
    record = streams.read_stream(client.store, name).value
    if record.format != "raw":
        raise streams.InvalidStreamFormatError(
            f"stream {name!r} holds {record.format} entries; read it with Spark (spark.read.format('ledger'))"
        )
    for ledger in streams.iter_ledgers(client.store, record, start, end):
        yield from _read_ledger(client, ledger, start, end, password)


def _read_ledger(
    client: LedgerClient, ledger: StreamLedger, start: int, end: int | None, password: bytes
) -> Iterator[StreamEntry]:
    handle = client.open_ledger(ledger.ledger_id, password=password, recover=False)
    # A sealed ledger ends at its recorded offset; the OPEN tail at what its writer has confirmed (the LAC the
    # open read).
    last_entry = ledger.last_offset - ledger.first_offset if ledger.last_offset is not None else handle.last_entry_id
    first_entry = max(0, start - ledger.first_offset)
    if end is not None:
        last_entry = min(last_entry, end - ledger.first_offset)
    if last_entry < first_entry:
        return
    for entry in handle.read(first_entry, last_entry):
        yield StreamEntry(ledger.first_offset + entry.entry_id, ledger.ledger_id, entry.entry_id, entry.payload,
                          entry.time_ms)
