"""Entry times: the entries of a timed ledger carry their writer's append time, inside the entry's bytes.

Format version 1, an entry of a ledger whose custom metadata has TIME_KEY = "1" (set when the ledger is
created, so readers of its OPEN tail know it too):

    append time (u64 little-endian, milliseconds since the epoch, the writer's clock) | the payload as written

The time is part of the bytes the client writes, so the entry digest covers it, and the storage node, the
journal and the wire protocol are unchanged. A ledger without the mark (written before entry times existed,
or a plain ledger of the client API) reads exactly as before: its entries have no time (None). A ledger
whose mark names a later version is refused with an error saying so, never misread.

Writers (StreamWriter, a Spark write task, a compaction) create the ledger with `marked(custom_metadata)`,
stamp every payload through a LedgerTimes (one per ledger) that takes its times from an AppendClock (one
per writer, over all of its ledgers), and close the ledger with `LedgerTimes.close_metadata()` in the
closing compare-and-set: the first and last append time of the ledger (FIRST_KEY, LAST_KEY), so that a time
search (time_search.py) and a Spark read's pruning choose ledgers from metadata alone. The clock gives
max(last, now): the times of one writer never decrease, even if its host's clock steps back.

Readers: ReadHandle.read (api.py) passes every chunk of entries through `stripped`, so that everything above
it (stream reads, Spark reads, `ledger read`, `ledger stream tail`, compaction) sees the payload as written
and the time as TimedEntry.time_ms. This module is the only place that knows the framing.

An Arrow entry (a Spark record batch) has one time for all of its rows. Kafka's record timestamp is per
record; here it is per entry: the rows of one entry were appended together, in one add.
"""
from __future__ import annotations

import dataclasses
import struct
import time
from typing import Iterable, Iterator, Mapping

from connector.client.ops.read import Entry
from metadata.errors import LedgerError
from metadata.model import LedgerMetadata

TIME_KEY = "entry.time"            # the mark: entries of this ledger start with their append time
VERSION = "1"
FIRST_KEY = "entry.time.first"     # at close: the earliest entry time (ms); absent for a ledger without entries
LAST_KEY = "entry.time.last"       # at close: the latest entry time (ms); for an empty ledger, its close time
FRAME = struct.Struct("<Q")


class EntryTimeFormatError(LedgerError):
    """A timed ledger's entry or mark cannot be decoded (too short, or a format this software does not know)."""


def marked(custom_metadata: Mapping[str, object] | None = None) -> dict[str, object]:
    """custom_metadata for a ledger to be created whose entries will carry times."""
    return {**(custom_metadata or {}), TIME_KEY: VERSION}


def carries_times(meta: LedgerMetadata) -> bool:
    """Whether the ledger's entries start with a time frame (its creator marked it so)."""
    version = meta.custom.get(TIME_KEY)
    if version is None:
        return False
    if version != VERSION:
        raise EntryTimeFormatError(
            f"ledger {meta.ledger_id}: its entries carry times in format {version!r}, this software reads format "
            f"{VERSION}; read it with the version of the connector that wrote it"
        )
    return True


@dataclasses.dataclass(frozen=True)
class TimedEntry(Entry):
    """An entry as read: its payload as written, and its append time in ms (None: the ledger has no times)."""

    time_ms: int | None = None


def frame(time_ms: int, payload: bytes) -> bytes:
    return FRAME.pack(time_ms) + payload


def split(payload: bytes | memoryview, where: str = "entry") -> tuple[int, bytes | memoryview]:
    """(append time, payload as written) of a timed ledger's entry; the payload a slice of the same type."""
    if len(payload) < FRAME.size:
        raise EntryTimeFormatError(
            f"{where} holds {len(payload)} bytes, too few for the {FRAME.size}-byte time its ledger's mark "
            f"({TIME_KEY}) promises; the ledger was written by other software under this mark"
        )
    return FRAME.unpack_from(payload)[0], payload[FRAME.size:]


def stripped(meta: LedgerMetadata, entries: Iterable[Entry], views: bool = False) -> Iterator[Entry]:
    """The entries of the ledger as written: a timed ledger's as TimedEntry without the frame; others as they are
    (TimedEntry with time_ms None). Payloads are bytes, copied at most once here; with views, a payload read as a
    view into its message (protos.wire) stays one, the frame cut off without a copy."""
    timed = carries_times(meta)
    for entry in entries:
        time_ms, payload = None, entry.payload
        if timed:
            time_ms, payload = split(memoryview(payload), f"entry {entry.entry_id} of ledger {meta.ledger_id}")
        yield TimedEntry(entry.entry_id, payload if views else bytes(payload), time_ms)


@dataclasses.dataclass(frozen=True)
class LedgerTimes:
    """The times a closed ledger's metadata records: first (None for a ledger without entries) and last (ms).
    Every entry's time lies in first..last; for one writer's ledger they are its first and last entry's."""

    first: int | None
    last: int

    @classmethod
    def of(cls, meta: LedgerMetadata) -> "LedgerTimes | None":
        """The times recorded at close, None if there are none: a ledger without times, one still OPEN, or one
        closed by a recovery (its writer died before closing it; read its entries for their times)."""
        custom = meta.custom
        if not meta.is_closed or LAST_KEY not in custom or not carries_times(meta):
            return None
        try:
            first = int(custom[FIRST_KEY]) if FIRST_KEY in custom else None
            return cls(first, int(custom[LAST_KEY]))
        except ValueError:
            return None  # damaged: read the entries instead, as for a ledger closed by a recovery


class AppendClock:
    """A writer's clock: milliseconds since the epoch, never below a time it gave before (or its floor)."""

    def __init__(self, floor: int = 0, now=time.time):
        self.last = floor
        self._now = now

    def now(self) -> int:
        self.last = max(self.last, int(self._now() * 1000))
        return self.last

    def advance_to(self, floor: int | None) -> None:
        """Never give a time below floor from now on (e.g. the previous owner's last time, on a takeover)."""
        if floor is not None:
            self.last = max(self.last, floor)


class Stamper:
    """Frames one ledger's payloads with times, and remembers the earliest and latest of them."""

    def __init__(self, clock: AppendClock):
        self.clock = clock
        self.first: int | None = None
        self.last: int | None = None

    def stamp(self, payload: bytes, time_ms: int | None = None) -> bytes:
        """payload framed with the clock's now, or with time_ms as it is: a copy keeps the time the entry's
        writer gave it (a compaction), so that rewriting a stream never changes a row's time."""
        if time_ms is None:
            time_ms = self.clock.now()
        self.first = time_ms if self.first is None else min(self.first, time_ms)
        self.last = time_ms if self.last is None else max(self.last, time_ms)
        return frame(time_ms, payload)

    def close_metadata(self) -> dict[str, int]:
        """For the closing compare-and-set: the earliest and latest append time; a ledger without entries records
        its close time as last (nothing in it is later), so that a time search can place it without reading it."""
        if self.first is None:
            return {LAST_KEY: self.clock.now()}
        return {FIRST_KEY: self.first, LAST_KEY: self.last}
