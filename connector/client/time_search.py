"""Finding a stream's first offset at or after a time (Kafka's offsetsForTimes) in O(log) reads.

The search has two binary searches, both over the predicate "reaches T" (the time is >= T):

1. over the stream's ledgers, by each ledger's last time: its book names are listed once (one ZooKeeper call),
   log2(books) probes find the book (each lists the book and reads its last page), then the pages of that book
   are searched: log2(pages) probes find the page, at most log2(256) the ledger within it. A ledger closed by
   its writer carries its first and last append time in its metadata (entry_time.LedgerTimes); a timed
   ledger closed by a recovery has its last entry read instead; the OPEN last ledger of a live writer
   reaches any time (its entries are searched).
2. over the entries of that ledger, by entry time, with single-entry reads: log2(entries) reads (none when
   the ledger's first time already reaches T).

So 1,000 ledgers of 1,000 entries cost about 10 ledger-metadata and 10 entry reads, not 1,000 of either.
The result is the offset of the entry found (an arrow entry's first row: an entry has one time for all of
its rows), or None when no entry reaches T (Kafka answers null there).

Times: each writer's times never decrease (entry_time.AppendClock), and a stream writer that takes over
starts from its predecessor's last time, so the times of a stream written by stream writers never decrease
and the search finds exactly the first offset at or after T. Where writers' clocks overlap (the parallel
task ledgers of one Spark write, or writers on hosts whose clocks disagree), offsets are not ordered by time:
the search then finds an offset whose time reaches T and whose ledger's predecessor ends before T, and rows
after it may carry earlier times (as Kafka's records of several producers may). Ledgers written before entry
times existed have no times: the search places them by their close time (the ledger znode's last write, as
retention by age does), taking all of such a ledger as at or after T once it closed at or after T. A ledger
without entries (its owner died before appending) reaches any time, as an OPEN one does, and holds no offset:
the search goes on to the next one. It used to be placed by its close time, which could lie below the times of
the ledgers before it (a writer whose clock ran ahead), and the search then skipped their entries; reaching any
time keeps the search right (it only ever lands on such a ledger when every ledger with entries before it ends
before T), and from such a ledger the search goes on by the same binary searches, not in order: O(log) probes per
such ledger it lands on.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Sequence, TypeVar

from connector.client.entry_time import LedgerTimes, carries_times
from metadata import layout, streams
from metadata.errors import LedgerError
from metadata.model import LedgerMetadata, StreamLedger, StreamRecord

if TYPE_CHECKING:
    from connector.client.api import LedgerClient, ReadHandle

L = TypeVar("L")
EntryRow = Callable[[bytes], int]   # an entry's payload -> the first row (within its ledger) it holds


class NoOffsetForTimeError(LedgerError):
    """No offset of a stream has a time at or after the one asked for (startingTimestamp with strategy error)."""


def first_true(lo: int, hi: int, reaches: Callable[[int], bool]) -> int:
    """The least i in [lo, hi) with reaches(i), hi if there is none; reaches is False then True over the range."""
    while lo < hi:
        middle = (lo + hi) // 2
        if reaches(middle):
            hi = middle
        else:
            lo = middle + 1
    return lo


def search(block_count: int, block: Callable[[int], Sequence[L]], reaches: Callable[[L], bool],
           offset_in: Callable[[L], int | None]) -> int | None:
    """The two-level search over ledgers in offset order, cut into blocks (pages, then the tail), none empty.

    reaches(ledger): its last time is at or after T (False for all ledgers with entries before some point, True
    after; a ledger without entries may answer True anywhere: it holds no offset). offset_in(ledger): the offset
    of its first entry at or after T, None if it has none. The first block whose last ledger reaches T is found by
    a binary search over the blocks, the first ledger reaching T by one within it; a ledger found that holds no
    such entry (one without entries, or a live tail whose entries are all earlier) makes the search go on past it
    the same way. Calls block() for O(log) blocks and reaches() for O(log) ledgers per ledger found without an
    offset: (log2(blocks) + log2(the largest block) + 2) each.
    """
    found, at = _first_reaching(block_count, block, reaches, -1, 0)
    while found is not None:
        ledger = block(found)[at]
        offset = offset_in(ledger)
        if offset is not None:
            return offset
        found, at = _first_reaching(block_count, block, reaches, found, at + 1)
    return None


def _first_reaching(block_count: int, block: Callable[[int], Sequence[L]], reaches: Callable[[L], bool],
                    current: int, start: int) -> tuple[int, int] | tuple[None, None]:
    """(block, index) of the first ledger reaching T from index `start` of block `current` on (current -1: from
    the first block), by binary searches; (None, None) if none does. A block whose last ledger does not reach T
    holds none with entries that does."""
    if current >= 0 and start < len(block(current)) and reaches(block(current)[-1]):
        ledgers = block(current)
        return current, first_true(start, len(ledgers) - 1, lambda i: reaches(ledgers[i]))
    found = first_true(current + 1, block_count, lambda b: reaches(block(b)[-1]))
    if found == block_count:
        return None, None
    ledgers = block(found)
    return found, first_true(0, len(ledgers) - 1, lambda i: reaches(ledgers[i]))


@dataclasses.dataclass
class SearchCost:
    """What one search read: page znodes, ledger metadata (znode reads and stats) and entries."""

    pages: int = 0
    ledgers: int = 0
    entries: int = 0


class LedgerProbe:
    """Reads of single ledgers for a search, each at most once: metadata, last times, entries (counted in cost)."""

    def __init__(self, client: "LedgerClient", password: bytes = b"", entry_row: EntryRow | None = None):
        self.client = client
        self.store = client.store
        self.password = password
        self.entry_row = entry_row
        self.cost = SearchCost()
        self._metadata: dict[int, LedgerMetadata] = {}
        self._last_times: dict[int, int | None] = {}
        self._handles: dict[int, "ReadHandle"] = {}
        self._entries: dict[tuple[int, int], object] = {}

    def meta(self, ledger_id: int) -> LedgerMetadata:
        if ledger_id not in self._metadata:
            self.cost.ledgers += 1
            self._metadata[ledger_id] = self.store.read_ledger(ledger_id).value
        return self._metadata[ledger_id]

    def last_time(self, ledger_id: int) -> int | None:
        """The ledger's last time (its close time if it has none); None for an OPEN ledger, and for a closed one
        without entries: it reaches any time (and holds no offset: the search goes on past it)."""
        if ledger_id not in self._last_times:
            self._last_times[ledger_id] = self._read_last_time(ledger_id)
        return self._last_times[ledger_id]

    def _read_last_time(self, ledger_id: int) -> int | None:
        meta = self.meta(ledger_id)
        if not meta.is_closed or meta.last_entry_id < 0:
            return None
        times = LedgerTimes.of(meta)
        if times is not None:
            return times.last
        if carries_times(meta) and meta.last_entry_id >= 0:
            return self.entry(ledger_id, meta.last_entry_id).time_ms   # closed by a recovery: no times recorded
        self.cost.ledgers += 1
        closed = self.store.modified_at(layout.ledger_path(ledger_id))
        return int(closed * 1000) if closed is not None else None

    def offset_in(self, ledger: StreamLedger, time_ms: int) -> int | None:
        """The offset of the ledger's first entry at or after time_ms; None if it has none (empty, or an OPEN
        ledger whose entries are all earlier). A ledger without times counts from its first entry."""
        meta = self.meta(ledger.ledger_id)
        last_entry = meta.last_entry_id if meta.is_closed else self._handle(ledger.ledger_id).last_entry_id
        if last_entry < 0 or ledger.empty:
            return None
        if not carries_times(meta):
            return ledger.first_offset
        times = LedgerTimes.of(meta)
        if times is not None and times.first is not None and times.first >= time_ms:
            entry = 0
        else:
            entry = first_true(0, last_entry + 1, lambda e: self.entry(ledger.ledger_id, e).time_ms >= time_ms)
        if entry > last_entry:
            return None
        return ledger.first_offset + self._row(ledger.ledger_id, entry)

    def _row(self, ledger_id: int, entry_id: int) -> int:
        """The first row of the entry within its ledger: its id in a raw ledger; an arrow ledger starts at row 0."""
        if self.entry_row is None:
            return entry_id
        return 0 if entry_id == 0 else self.entry_row(self.entry(ledger_id, entry_id).payload)

    def entry(self, ledger_id: int, entry_id: int):
        """One entry (an entry_time.TimedEntry), read with a single-entry read."""
        key = (ledger_id, entry_id)
        if key not in self._entries:
            self.cost.entries += 1
            self._entries[key] = next(iter(self._handle(ledger_id).read(entry_id, entry_id, confirmed=entry_id)))
        return self._entries[key]

    def _handle(self, ledger_id: int) -> "ReadHandle":
        """A reader of the ledger that never fences: an OPEN ledger is read up to its LAC."""
        if ledger_id not in self._handles:
            self._handles[ledger_id] = self.client.open_ledger(ledger_id, password=self.password, recover=False)
        return self._handles[ledger_id]


class TimeSearch:
    """One search over the stream whose head is record. entry_row: None for a raw stream (one offset per
    entry), else how to find an arrow entry's first row (connector.spark.encoding.entry_header)."""

    def __init__(self, client: "LedgerClient", record: StreamRecord, password: bytes = b"",
                 entry_row: EntryRow | None = None):
        self.record = record
        self.store = client.store
        self.probe = LedgerProbe(client, password, entry_row)
        self._regions: list | None = None
        self._region_blocks: dict[int, list] = {}

    @property
    def cost(self) -> SearchCost:
        return self.probe.cost

    def first_offset_at_or_after(self, time_ms: int) -> int | None:
        """A binary search over the stream's regions (its books, its flat pages, its tail) by each one's last
        ledger, then search() over the pages of the region found; where that finds no offset (its ledgers reaching
        T hold none), the same from the next region reaching T."""
        regions = self._region_list()

        def reaches(ledger: StreamLedger) -> bool:
            return self._reaches(ledger, time_ms)

        def region_reaches(region: int) -> bool:
            blocks = self._blocks(region)
            return reaches(self._block(blocks, len(blocks) - 1)[-1])

        region = first_true(0, len(regions), region_reaches)
        while region < len(regions):
            blocks = self._blocks(region)
            found = search(len(blocks), lambda b: self._block(blocks, b), reaches,
                           lambda ledger: self.probe.offset_in(ledger, time_ms))
            if found is not None:
                return found
            region = first_true(region + 1, len(regions), region_reaches)
        return None

    def _reaches(self, ledger: StreamLedger, time_ms: int) -> bool:
        if ledger.empty:
            return True    # no entries: it holds no offset, and the search goes on past it (search())
        last = self.probe.last_time(ledger.ledger_id)
        return last is None or last >= time_ms

    def _region_list(self) -> list:
        """The stream's ledgers in offset order, as regions: those of its pages (listed once), then its tail."""
        if self._regions is None:
            self.cost.pages += 1   # the listing of the book names
            tail = tuple(self.record.tail)
            self._regions = list(streams.regions(self.store, self.record)) + ([tail] if tail else [])
        return self._regions

    def _blocks(self, index: int) -> list:
        """A region's ledgers in offset order, as blocks: its live pages (listed once, not read yet), or the
        tail."""
        if index not in self._region_blocks:
            region = self._region_list()[index]
            if isinstance(region, tuple):
                self._region_blocks[index] = [region]
            else:
                self.cost.pages += 1   # the region's listing
                self._region_blocks[index] = list(streams.region_pages(self.store, self.record, region))
        return self._region_blocks[index]

    def _block(self, blocks: list, index: int) -> Sequence[StreamLedger]:
        block = blocks[index]
        if isinstance(block, tuple):
            return block
        self.cost.pages += 1
        kept = tuple(ledger for ledger in streams.read_page(self.store, self.record.name, block)
                     if ledger.last_offset >= self.record.first_offset)
        blocks[index] = kept   # read once
        return kept


def first_offset_at_or_after(client: "LedgerClient", record: StreamRecord, time_ms: int, password: bytes = b"",
                             entry_row: EntryRow | None = None) -> int | None:
    """The stream's first offset whose time is at or after time_ms, None if none is (see the module's docstring)."""
    return TimeSearch(client, record, password, entry_row).first_offset_at_or_after(time_ms)


def last_time(client: "LedgerClient", ledger_id: int, password: bytes = b"") -> int | None:
    """A closed ledger's last time (its close time if its entries have none), for a writer that takes over a
    stream and must not go below it; None for a ledger still OPEN."""
    return LedgerProbe(client, password).last_time(ledger_id)
