"""A streaming query's lag, as Kafka's consumer-group lag: per stream, the offset the query has committed, the
stream's latest offset, and the rows and bytes in between.

Where the query stands is in its checkpoint (connector/checkpoint.py).

Where the stream ends is in its head: the end of its last ledger, or, for the OPEN tail of a raw stream's
live writer, the entry that writer last confirmed (its LAC, read from the nodes without fencing anything).
An arrow ledger's rows are known once it is sealed, so an OPEN arrow tail ends the stream where it starts.

Bytes behind come from ledger metadata: the length of every closed ledger wholly behind, a share of the
ledger the query is in (its length times the part of its offsets still to read), and, at the average bytes
per offset of those ledgers, the offsets whose bytes no metadata gives (an OPEN tail, a ledger closed by
recovery, more than LAG_LEDGERS ledgers behind, offsets below the head's tail). Only the head and the
metadata of at most LAG_LEDGERS of its tail's ledgers are read (DESIGN rule 15); `estimated_offsets` says
how many offsets were not counted from whole ledgers' lengths.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from metadata import streams
from metadata.errors import LedgerError
from metadata.model import StreamLedger, StreamRecord

if TYPE_CHECKING:
    from connector.client import LedgerClient

ARROW = "arrow"   # connector.spark.commit.ARROW, without importing Spark into the CLI
LAG_LEDGERS = 64  # the newest ledgers behind whose metadata is read for the bytes behind


@dataclasses.dataclass(frozen=True)
class Lag:
    """Where a reader of a stream stands against its end (offsets: the next one to read; latest: the one after
    the last readable); rows_behind and bytes_behind are None when the reader has committed nothing."""

    stream: str
    committed_offset: int | None
    latest_offset: int
    first_offset: int
    rows_behind: int | None
    bytes_behind: int | None
    estimated_offsets: int = 0   # offsets behind whose bytes were estimated, not counted from a whole ledger

    @property
    def rows_gone(self) -> int:
        """Committed offsets the stream no longer holds (truncated or expired under the query)."""
        return 0 if self.committed_offset is None else max(0, self.first_offset - self.committed_offset)

    def describe(self) -> str:
        if self.committed_offset is None:
            return f"stream {self.stream!r}: no batch committed yet; latest offset {self.latest_offset}"
        text = (f"stream {self.stream!r}: committed offset {self.committed_offset}, latest offset "
                f"{self.latest_offset}: {self.rows_behind:,} rows and {bytes_text(self)} behind")
        if self.rows_gone:
            text += (f"; offsets {self.committed_offset}..{self.first_offset - 1} are gone from the stream "
                     "(failOnDataLoss decides what the query does)")
        return text

    def as_json(self) -> dict:
        return dict(dataclasses.asdict(self), rows_gone=self.rows_gone)


def bytes_text(lag: Lag) -> str:
    if lag.bytes_behind is None:
        return "an unknown number of bytes"
    return f"{'~' if lag.estimated_offsets else ''}{lag.bytes_behind:,} bytes"


# -- the stream's side ---------------------------------------------------------------------------------


def stream_lag(lc: "LedgerClient", name: str, committed: int | None, password: bytes = b"") -> Lag:
    """The lag of a reader that has committed offsets below `committed` (the next one it reads) of stream name."""
    record = streams.read_stream(lc.store, name).value
    latest = latest_offset(lc, record, password)
    if committed is None:
        return Lag(name, None, latest, record.first_offset, None, None)
    lo = max(committed, record.first_offset)
    size, estimated = _bytes_behind(lc, record, lo, latest, password)
    return Lag(name, committed, latest, record.first_offset, max(0, latest - committed), size, estimated)


def latest_offset(lc: "LedgerClient", record: StreamRecord, password: bytes = b"") -> int:
    """The offset after the last one readable now: the end of the last ledger, or of an OPEN raw tail's LAC."""
    last = record.last_ledger
    if last is None:
        return record.first_offset
    if last.last_offset is not None:
        return last.last_offset + 1
    if record.format == ARROW:
        return last.first_offset  # its rows are known once it is sealed
    meta = lc.ledger_metadata(last.ledger_id)
    if meta.is_closed:  # closed by a recovery, not yet sealed on the stream
        return last.first_offset + meta.last_entry_id + 1
    tail = lc.open_ledger(last.ledger_id, password=password, recover=False)  # reads its LAC
    return last.first_offset + tail.last_entry_id + 1


def _bytes_behind(lc: "LedgerClient", record: StreamRecord, lo: int, hi: int, password: bytes) -> tuple[int | None, int]:
    """(bytes, offsets estimated) of offsets [lo, hi): see the module's docstring."""
    if lo >= hi:
        return 0, 0
    behind = [ledger for ledger in record.tail if _meets(ledger, lo, hi)]
    counted, unknown, sizes = 0.0, max(0, min(hi, record.tail_offset) - lo), []
    for ledger in behind[:-LAG_LEDGERS]:
        unknown += _rows_in(ledger, lo, hi)
    estimated = unknown
    for ledger in behind[-LAG_LEDGERS:]:
        rows = _rows_in(ledger, lo, hi)
        length = _length(lc, ledger)
        if length is None:
            unknown += rows
            estimated += rows
            continue
        held = ledger.last_offset - ledger.first_offset + 1
        sizes.append((length, held))
        counted += length * rows / held
        if rows != held:
            estimated += rows
    if unknown:
        per_offset = _per_offset(record, sizes)
        if per_offset is None:
            return None, estimated
        counted += unknown * per_offset
    return round(counted), estimated


def _length(lc: "LedgerClient", ledger: StreamLedger) -> int | None:
    """The bytes of a sealed ledger from its metadata; None for an OPEN one or one whose length is unknown."""
    if ledger.last_offset is None or ledger.last_offset < ledger.first_offset:
        return None
    try:
        meta = lc.ledger_metadata(ledger.ledger_id)
    except LedgerError:
        return None  # deleted meanwhile (a truncation): its offsets are estimated
    return meta.length if meta.is_closed and meta.length >= 0 else None


def _per_offset(record: StreamRecord, sizes: list[tuple[int, int]]) -> float | None:
    """Bytes per offset from the ledgers read, else from what retention by size counted, else unknown."""
    if sizes:
        return sum(length for length, _ in sizes) / sum(held for _, held in sizes)
    count = record.byte_count
    if count is not None and count.end_offset > count.first_offset:
        return count.bytes / (count.end_offset - count.first_offset)
    return None


def _meets(ledger: StreamLedger, lo: int, hi: int) -> bool:
    return ledger.first_offset < hi and (ledger.last_offset is None or ledger.last_offset >= lo)


def _rows_in(ledger: StreamLedger, lo: int, hi: int) -> int:
    last = hi - 1 if ledger.last_offset is None else min(ledger.last_offset, hi - 1)
    return max(0, last - max(lo, ledger.first_offset) + 1)
