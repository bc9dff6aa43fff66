"""What a read covers: the ledgers of a stream or the ledgers named by id, each with its last entry.

Before planning, the driver recovers dangling ledgers (OPEN, writer gone) and seals a recovered
stream tail: the stream record gets the tail's last offset, so every later reader and writer sees
the ledger as closed. The OPEN tail of a live writer is read up to its last add confirmed.

A streaming micro-batch is planned from the offsets its latestOffset promised instead (batch_spans):
no second LAC read, which could answer less than the first (DESIGN rule 17).

Callers pass the ledgers they need (streams.iter_ledgers for an offset range, or the head's tail), so a
read that starts at offset k reads no page and no ledger metadata below k (rule 15); a span carries the
row index of a closed arrow ledger, so that the read skips its entries below k too (planning.py), and the
append times its writer recorded at close, so that _timestamp filters prune it (planning.py).
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

from connector.client import LedgerClient
from connector.client.entry_time import LedgerTimes, carries_times
from connector.spark.commit import ARROW, sealed
from connector.spark.encoding import entry_header
from connector.spark.planning import LedgerSpan
from connector.spark.recovery import check_password, recover
from connector.spark.row_index import RowIndex
from metadata.errors import LedgerError
from metadata.model import LedgerMetadata, StreamLedger, StreamRecord, Versioned
from metadata.store import MetadataStore
from metadata.streams import iter_ledgers, update_stream


@dataclasses.dataclass(frozen=True)
class ReadableEnd:
    """How far a ledger can be read: its last entry, whether it is closed there, its length in bytes (-1 if
    unknown), its row index (None if it has none), its first and last append time (None if not recorded),
    whether its entries carry no times at all, and for an OPEN ledger the metadata this end was read with (so
    that the caller that goes on to wait on its LAC need not read it again)."""

    last_entry: int
    closed: bool
    length: int = -1
    row_index: RowIndex | None = None
    time_range: tuple[int, int] | None = None
    untimed: bool = False
    current: Versioned[LedgerMetadata] | None = dataclasses.field(default=None, compare=False, repr=False)


def readable_end(lc: LedgerClient, ledger_id: int, password: bytes, recover_dangling: bool,
                 known: dict[int, ReadableEnd] | None = None) -> ReadableEnd:
    """known: ends found before, by ledger id, and the end found here is put in it. A closed ledger's end never
    changes, so it is not read again; for the OPEN ledger of a live writer it is the end read last time."""
    before = None if known is None else known.get(ledger_id)
    if before is not None and before.closed:
        return before
    end = _readable_end(lc, ledger_id, password, recover_dangling, before)
    if known is not None:
        known[ledger_id] = end
    return end


def _readable_end(lc: LedgerClient, ledger_id: int, password: bytes, recover_dangling: bool,
                  before: ReadableEnd | None = None) -> ReadableEnd:
    """The metadata is read once. A dangling ledger is recovered before any node is asked for its LAC; for an
    OPEN ledger seen before (before), its LAC is read first, and a LAC past the one seen then shows its writer
    alive without asking ZooKeeper (a writer gone since is found on the next call, when its LAC stands still).
    An OPEN ledger's end is never less than the one seen before: each node's LAC lags its own way, so the nodes
    asked now may know less than those asked then, but what was confirmed stays confirmed (rule 13), and a
    streaming source's next end must not fall below the one it promised (rule 17)."""
    current = lc.store.read_ledger(ledger_id)
    meta = current.value
    check_password(meta, password, f"ledger {ledger_id}")
    untimed = not carries_times(meta)
    if meta.is_closed:
        return ReadableEnd(meta.last_entry_id, True, meta.length, RowIndex.of(meta), _time_range(meta), untimed)
    if recover_dangling and before is None and lc.is_dangling(meta):
        return ReadableEnd(recover(lc, ledger_id, password), True, untimed=untimed)
    lac = lc.open_ledger(ledger_id, password=password, recover=False, current=current).last_entry_id  # asks the nodes
    if before is None:
        return ReadableEnd(lac, False, untimed=untimed, current=current)
    if recover_dangling and lac <= before.last_entry and lc.is_dangling(meta):
        return ReadableEnd(recover(lc, ledger_id, password), True, untimed=untimed)
    return ReadableEnd(max(lac, before.last_entry), False, untimed=untimed, current=current)


def confirmed_past(known: dict[int, ReadableEnd], ledger_id: int, lac: int) -> None:
    """Note in known an OPEN ledger's LAC learnt outside readable_end (a streaming source's long poll): the next
    call compares its LAC with this one to tell a live writer, and returns no less."""
    before = known.get(ledger_id)
    if before is not None and not before.closed and lac > before.last_entry:
        known[ledger_id] = dataclasses.replace(before, last_entry=lac)


def _time_range(meta: LedgerMetadata) -> tuple[int, int] | None:
    times = LedgerTimes.of(meta)
    return None if times is None or times.first is None else (times.first, times.last)


def ledger_spans(lc: LedgerClient, ledger_ids, password: bytes, recover_dangling: bool) -> list[LedgerSpan]:
    spans = []
    for ledger_id in ledger_ids:
        end = readable_end(lc, ledger_id, password, recover_dangling)
        spans.append(LedgerSpan(ledger_id, end.last_entry, time_range=end.time_range, untimed=end.untimed))
    return spans


def stream_spans(
    lc: LedgerClient, record: StreamRecord, ledgers: Iterable[StreamLedger], password: bytes, recover_dangling: bool,
    known: dict[int, ReadableEnd] | None = None,
) -> tuple[StreamRecord, list[LedgerSpan]]:
    """The spans of ledgers of the stream whose head is record; a recovered OPEN ledger is sealed on the
    stream, and the head returned is the stream's after that. known: as for readable_end."""
    spans = []
    for ledger in ledgers:
        end = readable_end(lc, ledger.ledger_id, password, recover_dangling, known)
        last_offset = ledger.last_offset
        if last_offset is None and end.closed:
            last_offset = _closed_last_offset(lc, record.format, ledger, end.last_entry, password)
            # read_back: once the seal landed, sealed() finds the ledger sealed and changes nothing (rule 16)
            record = update_stream(lc.store, record.name, lambda r: sealed(r, ledger.ledger_id, last_offset),
                                   read_back=True).value
        spans.append(LedgerSpan(ledger.ledger_id, end.last_entry, ledger.first_offset, last_offset, end.length,
                                end.row_index, end.time_range, end.untimed))
    return record, spans


def batch_spans(store: MetadataStore, record: StreamRecord, lo: int, hi: int) -> tuple[list[LedgerSpan], int | None]:
    """The ledgers holding offsets lo..hi of a micro-batch, and the last offset the stream holds (None: any).

    hi is an end latestOffset promised, so the data is known to reach it (rule 17), and no LAC is read
    again: each node's LAC lags its own way, and a second read could answer less than the first. The
    OPEN tail of a raw stream is planned up to hi (entries up to a LAC someone saw were acknowledged; the
    executors read them with confirmed=), and it reaches any end. An arrow ledger's rows are known once
    it is sealed, so its OPEN tail holds none yet; the last entry of a sealed one is in its metadata.
    Only the pages and ledger metadata of this range are read (rule 15).
    """
    raw = record.format != ARROW
    ledgers = list(iter_ledgers(store, record, lo, hi))
    spans: list[LedgerSpan] = []
    for ledger, following in zip(ledgers, ledgers[1:] + [None]):
        last_offset = ledger.last_offset
        if last_offset is None and following is not None:
            last_offset = following.first_offset - 1  # offsets are contiguous
        if last_offset is None and not raw:
            break
        if raw:
            last_entry = (hi if last_offset is None else last_offset) - ledger.first_offset
            spans.append(LedgerSpan(ledger.ledger_id, last_entry, ledger.first_offset, last_offset))
        else:
            meta = _sealed_metadata(store, ledger.ledger_id)
            spans.append(LedgerSpan(ledger.ledger_id, meta.last_entry_id, ledger.first_offset, last_offset,
                                    meta.length, row_index=RowIndex.of(meta)))
    return spans, _reach(record)


def _reach(record: StreamRecord) -> int | None:
    """The last offset the stream holds; None for the OPEN tail of a raw stream, which reaches any end."""
    last = record.last_ledger
    if last is None:
        return record.first_offset - 1
    if last.last_offset is not None:
        return last.last_offset
    return None if record.format != ARROW else last.first_offset - 1


def _sealed_metadata(store: MetadataStore, ledger_id: int) -> LedgerMetadata:
    meta = store.read_ledger(ledger_id).value
    if not meta.is_closed:
        raise LedgerError(
            f"ledger {ledger_id}: its stream gives it row offsets, but its metadata says it is not closed; the "
            "stream record and the ledger disagree, so the rows a micro-batch promised cannot be planned"
        )
    return meta


def _closed_last_offset(lc: LedgerClient, fmt: str, ledger: StreamLedger, last_entry: int, password: bytes) -> int:
    if fmt != ARROW:
        return ledger.first_offset + last_entry  # one offset per entry
    if last_entry < 0:
        return ledger.first_offset - 1
    last = next(iter(lc.open_ledger(ledger.ledger_id, password=password, recover=False).read(last_entry, last_entry)))
    first_row, rows = entry_header(last.payload)
    return ledger.first_offset + first_row + rows - 1
