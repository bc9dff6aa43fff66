"""Where each stored entry of a ledger lives in the journal: entry id -> (segment, offset, length).

Compact: a per-ledger array of packed locations indexed by entry id from the first id stored (the dense
window), with -1 for entries this node does not hold (striping leaves holes, rule 1). Holes never outnumber
HOLES_PER_ENTRY times the entries stored (plus a small allowance), so a client that adds ids at wide strides costs
memory in proportion to what it stored, not to the ids' spread. An id the window cannot take goes to the overflow
(OverflowRuns): below the window (a recovery add or a re-replication's copy of an earlier fragment onto a node that
holds a later one), and, when an id comes too far above the window (a node chosen again for a ledger written
without it for a while), the window itself goes there and a new one starts at that id, so the ledger's new entries
are appended densely again. The overflow keeps its entries in dense runs of its own, sorted by first id: as compact
as the window for ids that come in order, found by a binary search over the runs. (It was a dict: about 205 bytes an
entry, and a range read scanned every key, 12-15 ms per read at 400,000 entries; a node chosen again for a long
ledger put every later entry there.) Like the window's slots, the overflow keeps the range of ids whose records lie
in each file (ids_by_file), so that compaction searches only those ids of a moved window, not all of it.

Each index also keeps, per file, the bytes of the records it points to there (bytes_by_file) and the range of
dense slots they lie in (slots_by_file), changed with every put: compaction asks which files are mostly dead at
every round, and which entries to move out of the files it rewrites, and neither answer may cost a pass over
every entry the node holds (10 million entries took 1.2 s of the event loop per pass). The moves are searched
(in NumPy) only in the ledgers with records in those files, and there only in those files' slot ranges. A
LiveBytes sums those tallies over every ledger the node holds as they change, and knows which ledgers have records
in each file, so a round's planning costs neither a pass over every entry nor one over every ledger (200,000
ledgers took some 100 ms of the event loop per round).
"""
from __future__ import annotations

import bisect
from array import array
from typing import Iterable, Iterator

import numpy as np

_OFFSET_BITS = 40                    # segments up to 1 TiB
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1
HOLES_PER_ENTRY = 16                 # holes a window or run may hold per entry it holds (striping: E/WQ - 1 each)
_FREE_HOLES = 1 << 10                # holes allowed however few entries are stored
ABSENT = -1


def pack(segment: int, offset: int) -> int:
    return (segment << _OFFSET_BITS) | offset


def unpack(location: int) -> tuple[int, int]:
    return location >> _OFFSET_BITS, location & _OFFSET_MASK


def file_of(location: int) -> int:
    """The segment (or compacted file) number of a packed location."""
    return location >> _OFFSET_BITS


def _holes_allowed(slots: int, entries: int) -> bool:
    """Whether a window or run of `slots` slots holding `entries` entries keeps its holes within bounds."""
    return slots - entries <= _FREE_HOLES + HOLES_PER_ENTRY * entries


def _pad(locations: array, lengths: array, holes: int) -> None:
    """Append `holes` absent slots to a window or run."""
    if holes:
        locations.extend(array("q", [ABSENT]) * holes)
        lengths.extend(array("i", [0]) * holes)


def _append(locations: array, lengths: array, holes: int, location: int, length: int) -> None:
    """Append an entry's record to a window or run, after `holes` absent slots."""
    _pad(locations, lengths, holes)
    locations.append(location)
    lengths.append(length)


class _Run:
    """Entries first..first + len - 1 of the overflow, densely (ABSENT where none is stored)."""

    __slots__ = ("first", "locations", "lengths", "count")

    def __init__(self, first: int, locations: array | None = None, lengths: array | None = None, count: int = 0):
        self.first = first
        self.locations = array("q") if locations is None else locations
        self.lengths = array("i") if lengths is None else lengths
        self.count = count

    @property
    def end(self) -> int:
        return self.first + len(self.locations)


class OverflowRuns:
    """The entries of a ledger's index outside its dense window: entry id -> (packed location, record length), in
    dense runs sorted by first id (no two runs share an id). As compact as the window for ids that come in order;
    lookups are a binary search over the runs. Iterating yields the ids in ascending order."""

    __slots__ = ("_runs", "_firsts", "count", "ids_by_file")

    def __init__(self, records: dict[int, tuple[int, int]] | None = None):
        self._runs: list[_Run] = []
        self._firsts: list[int] = []    # each run's first id, for bisect
        self.count = 0
        # file number -> [lowest, highest] id whose record has lain in it: holds all of the file's records here (as
        # LedgerIndex.slots_by_file: it does not shrink as they leave; forget_file drops it with the file's last byte)
        self.ids_by_file: dict[int, list[int]] = {}
        for entry_id, (location, length) in sorted((records or {}).items()):
            self.put(entry_id, location, length)

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __iter__(self) -> Iterator[int]:
        for entry_id, _ in self.items():
            yield entry_id

    def __contains__(self, entry_id: int) -> bool:
        return self.get(entry_id) is not None

    def __getitem__(self, entry_id: int) -> tuple[int, int]:
        found = self.get(entry_id)
        if found is None:
            raise KeyError(entry_id)
        return found

    def keys(self) -> Iterator[int]:
        return iter(self)

    def values(self) -> Iterator[tuple[int, int]]:
        for _, record in self.items():
            yield record

    def items(self) -> Iterator[tuple[int, tuple[int, int]]]:
        for run in self._runs:
            for slot, location in enumerate(run.locations):
                if location != ABSENT:
                    yield run.first + slot, (location, run.lengths[slot])

    def _run_at(self, entry_id: int) -> int:
        """The index of the last run starting at or below entry_id (-1: none)."""
        return bisect.bisect_right(self._firsts, entry_id) - 1

    def get(self, entry_id: int) -> tuple[int, int] | None:
        i = self._run_at(entry_id)
        if i >= 0:
            run = self._runs[i]
            slot = entry_id - run.first
            if slot < len(run.locations):
                location = run.locations[slot]
                if location != ABSENT:
                    return location, run.lengths[slot]
        return None

    def put(self, entry_id: int, location: int, length: int) -> tuple[int, int] | None:
        """Store the entry's record; the record it replaces, or None."""
        span = self.ids_by_file.get(location >> _OFFSET_BITS)   # _span, inline: a checkpoint's load puts every entry
        if span is None:
            self.ids_by_file[location >> _OFFSET_BITS] = [entry_id, entry_id]
        elif entry_id > span[1]:
            span[1] = entry_id
        elif entry_id < span[0]:
            span[0] = entry_id
        i = self._run_at(entry_id)
        if i >= 0:
            run = self._runs[i]
            slot = entry_id - run.first
            size = len(run.locations)
            if slot < size:
                old = run.locations[slot]
                old_record = None if old == ABSENT else (old, run.lengths[slot])
                if old_record is None:
                    run.count += 1
                    self.count += 1
                run.locations[slot], run.lengths[slot] = location, length
                return old_record
            following = self._firsts[i + 1] if i + 1 < len(self._runs) else None
            if (following is None or entry_id < following) and _holes_allowed(slot + 1, run.count + 1):
                _append(run.locations, run.lengths, slot - size, location, length)
                run.count += 1
                self.count += 1
                return None
        self._insert(i + 1, _Run(entry_id, array("q", [location]), array("i", [length]), 1))
        self.count += 1
        return None

    def pop(self, entry_id: int) -> tuple[int, int]:
        i = self._run_at(entry_id)
        run = self._runs[i] if i >= 0 else None
        slot = entry_id - run.first if run is not None else -1
        if run is None or slot >= len(run.locations) or run.locations[slot] == ABSENT:
            raise KeyError(entry_id)
        record = run.locations[slot], run.lengths[slot]
        run.locations[slot] = ABSENT
        run.count -= 1
        self.count -= 1
        if not run.count:
            del self._runs[i], self._firsts[i]
        return record

    def adopt(self, first: int, locations: array, lengths: array, count: int,
              slots_by_file: dict[int, tuple[int, int]] | None = None) -> None:
        """Take a dense window whole (no copy) as a run: none of its ids may be in the overflow. slots_by_file: the
        window's (LedgerIndex.slots_by_file), holding every record of it; found in the arrays if not given."""
        if not count:
            return
        self._insert(bisect.bisect_right(self._firsts, first), _Run(first, locations, lengths, count))
        self.count += count
        if slots_by_file is None:
            slots_by_file = _file_tallies(locations, lengths)[1]
        for number, (low, high) in slots_by_file.items():
            self._span(number, first + low, first + high)

    def _span(self, number: int, low: int, high: int) -> None:
        """Ids low..high have records in file `number`."""
        span = self.ids_by_file.get(number)
        if span is None:
            self.ids_by_file[number] = [low, high]
        else:
            if low < span[0]:
                span[0] = low
            if high > span[1]:
                span[1] = high

    def forget_file(self, number: int) -> None:
        """No record here lies in file `number` any more."""
        self.ids_by_file.pop(number, None)

    def _insert(self, i: int, run: _Run) -> None:
        self._runs.insert(i, run)
        self._firsts.insert(i, run.first)

    def last_id(self) -> int:
        """The highest id stored (-1: none)."""
        for run in reversed(self._runs):
            for slot in range(len(run.locations) - 1, -1, -1):
                if run.locations[slot] != ABSENT:
                    return run.first + slot
        return -1

    def _slices(self, first: int, last: int) -> Iterator[tuple[_Run, int, int]]:
        """(run, low, high): the slots low..high of each run that hold ids in [first, last], ascending."""
        i = max(0, self._run_at(first))
        for run in self._runs[i:]:
            if run.first > last:
                break
            low, high = max(first, run.first) - run.first, min(last, run.end - 1) - run.first
            if low <= high:
                yield run, low, high

    def ids_between(self, first: int, last: int) -> list[int]:
        """Ids stored in [first, last], ascending."""
        found: list[int] = []
        for run, low, high in self._slices(first, last):
            locations = np.frombuffer(run.locations, dtype=np.int64)[low:high + 1]
            found.extend((np.flatnonzero(locations != ABSENT) + (run.first + low)).tolist())
            del locations
        return found

    def records_in(self, wanted: list[int]) -> list[tuple[int, int, int]]:
        """(entry id, location, length) of every entry whose record lies in one of the files `wanted`, ascending by
        id. Only the ids those files' records lie among (ids_by_file) are searched: a moved window of millions of
        entries is not scanned whole for a file that holds a few of them."""
        found: list[tuple[int, int, int]] = []
        for first, last in _merged(sorted(tuple(self.ids_by_file[n]) for n in wanted if n in self.ids_by_file)):
            for run, low, high in self._slices(first, last):
                # Views of the arrays: none may outlive this step (an array cannot grow while one exists).
                locations = np.frombuffer(run.locations, dtype=np.int64)[low:high + 1]
                slots = np.flatnonzero((locations != ABSENT) & np.isin(locations >> _OFFSET_BITS, wanted))
                if len(slots):
                    lengths = np.frombuffer(run.lengths, dtype=np.int32)[low:high + 1][slots].tolist()
                    found.extend(zip((slots + (run.first + low)).tolist(), locations[slots].tolist(), lengths))
                del locations
        return found


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted (low, high) spans, those that overlap or touch joined."""
    merged: list[tuple[int, int]] = []
    for low, high in spans:
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged


def _file_tallies(locations: array, lengths: array) -> tuple[dict[int, int], dict[int, tuple[int, int]], int]:
    """Of a window's arrays: the bytes of the records in each file, the (lowest, highest) slot of each file's
    records, and how many records there are (LedgerIndex.bytes_by_file, slots_by_file, count)."""
    if not locations:
        return {}, {}, 0
    view = np.frombuffer(locations, dtype=np.int64)
    slots = np.flatnonzero(view != ABSENT)
    files = view[slots] >> _OFFSET_BITS
    sizes = np.frombuffer(lengths, dtype=np.int32)[slots].astype(np.int64)
    del view
    order = np.argsort(files, kind="stable")     # by file, and by slot within a file
    files, sizes, slots = files[order], sizes[order], slots[order]
    numbers, starts = np.unique(files, return_index=True)
    if not len(numbers):
        return {}, {}, 0
    ends = np.append(starts[1:], len(slots)) - 1
    return (dict(zip(numbers.tolist(), np.add.reduceat(sizes, starts).tolist())),
            dict(zip(numbers.tolist(), zip(slots[starts].tolist(), slots[ends].tolist()))), len(slots))


class LedgerIndex:
    __slots__ = ("base", "locations", "lengths", "overflow", "count", "bytes_by_file", "slots_by_file",
                 "checkpointed", "checkpointed_base", "reshaped_from", "changed_slots", "overflow_changed", "live",
                 "owner")

    def __init__(self, base: int = -1):
        self.base = base                         # entry id of locations[0]; -1 until the first put
        self.locations = array("q")
        self.lengths = array("i")
        self.overflow = OverflowRuns()
        self.count = 0                           # stored entries (window and overflow)
        self.bytes_by_file: dict[int, int] = {}  # file number -> bytes of the records indexed here (none: absent)
        # file number -> (lowest, highest) dense slot that has pointed into it: holds all of its dense records
        # (it does not shrink as they leave; it goes with the file's last byte)
        self.slots_by_file: dict[int, tuple[int, int]] = {}
        # What changed since the last checkpoint that holds this index (checkpoint.py, deltas): the dense slots
        # from `checkpointed` on are new, the slots in changed_slots (all below it) were overwritten; a window that
        # moved since (base != checkpointed_base) is written whole. checkpointed_base is None until a checkpoint
        # holds the index.
        self.checkpointed = 0
        self.checkpointed_base: int | None = None
        self.reshaped_from: int | None = None     # the base recount found, when it moved the window (_below_window)
        self.changed_slots: set[int] = set()
        self.overflow_changed = False
        self.live: LiveBytes | None = None      # the node's sum of the tallies, while it counts this index
        self.owner = None                       # what the LiveBytes names as holding this index's records

    def put(self, entry_id: int, location: int, length: int) -> None:
        if self.base < 0:
            self.base = entry_id
        slot = entry_id - self.base
        size = len(self.locations)
        if 0 <= slot < size:
            old = self.locations[slot]
            if old == ABSENT:
                self.count += 1
            else:
                self._tally(old, -self.lengths[slot])
            if slot < self.checkpointed:
                self.changed_slots.add(slot)
            self.locations[slot] = location
            self.lengths[slot] = length
            self._span(location, slot, slot)
        elif size <= slot:   # above the window, where no overflow id is (_below_window)
            if not self._window_takes(slot + 1, 1):
                self._move_window(entry_id)     # too far above it: a new window starts at entry_id
                slot = size = 0
            _append(self.locations, self.lengths, slot - size, location, length)
            self.count += 1
            self._span(location, slot, slot)
        else:
            old_record = self.overflow.put(entry_id, location, length)
            self.overflow_changed = True
            if old_record is not None:
                # The new record is counted before the replaced one leaves: a file that loses its last byte here
                # forgets the overflow's ids in it (forget_file), so it must not be the new record's file.
                self._tally(location, length)
                self._tally(old_record[0], -old_record[1])
                return
            self.count += 1
        self._tally(location, length)

    def _window_takes(self, slots: int, new: int) -> bool:
        """Whether the window may grow to `slots` slots with `new` more entries (its holes stay within bounds)."""
        return _holes_allowed(slots, self.count - self.overflow.count + new)

    def _move_window(self, entry_id: int) -> None:
        """The window goes to the overflow as it is (none of its ids is there), and a new, empty one starts at
        entry_id: a checkpoint then writes this index whole (changes)."""
        window_entries = self.count - len(self.overflow)
        self.overflow.adopt(self.base, self.locations, self.lengths, window_entries, self.slots_by_file)
        self.base = entry_id
        self.locations, self.lengths = array("q"), array("i")
        self.slots_by_file = {}
        self.checkpointed = 0
        self.changed_slots.clear()
        self.overflow_changed = True

    def put_run(self, first_entry_id: int, locations, lengths) -> None:
        """put() of entries first_entry_id, first_entry_id + 1, ... at locations (an array("q")) with lengths;
        in one step when they extend the dense window and lie one after another in one file, as the records of
        a run of new entries in a journal group do."""
        if self.base < 0:
            self.base = first_entry_id
        slot = first_entry_id - self.base
        size = len(self.locations)
        total = sum(lengths)
        # put()'s rule for the first entry; every later one then lands at the end of the window. The records lie
        # one after another in one file when the last starts where the others end, in the first one's file.
        if (locations and file_of(locations[0]) == file_of(locations[-1])
                and locations[-1] - locations[0] == total - lengths[-1]
                and size <= slot and self._window_takes(slot + 1, 1)):   # as put() takes the first
            _pad(self.locations, self.lengths, slot - size)
            self.locations.extend(locations)
            self.lengths.extend(lengths)
            self.count += len(lengths)
            self._tally(locations[0], total)
            self._span(locations[0], slot, slot + len(lengths) - 1)
            return
        for offset, (location, length) in enumerate(zip(locations, lengths)):
            self.put(first_entry_id + offset, location, length)

    def _tally(self, location: int, length: int) -> None:
        """Count length bytes (less when negative) in the file of location."""
        number = location >> _OFFSET_BITS
        before = self.bytes_by_file.get(number, 0)
        total = before + length
        if total:
            self.bytes_by_file[number] = total
        else:
            del self.bytes_by_file[number]
            self.slots_by_file.pop(number, None)
            self.overflow.forget_file(number)
        if self.live is not None:
            self.live.count(number, length, self.owner, total != 0, (before == 0) != (total == 0))

    def _span(self, location: int, low: int, high: int) -> None:
        """Dense slots low..high point into the file of location."""
        number = location >> _OFFSET_BITS
        span = self.slots_by_file.get(number)
        if span is None:
            self.slots_by_file[number] = (low, high)
        elif low < span[0] or high > span[1]:
            self.slots_by_file[number] = (min(low, span[0]), max(high, span[1]))

    def changes(self) -> tuple[int, list[int], OverflowRuns | None]:
        """What changed since the last checkpoint: the first new dense slot, the slots below it that changed
        (ascending), and the overflow if it changed (else None); everything when the window moved (rewritten)."""
        if self.base != self.checkpointed_base:
            return 0, [], self.overflow
        return self.checkpointed, sorted(self.changed_slots), self.overflow if self.overflow_changed else None

    def rewritten(self) -> bool:
        """Whether a checkpoint held this index with its window elsewhere: a delta then replaces it whole."""
        return self.checkpointed_base is not None and self.base != self.checkpointed_base

    def mark_checkpointed(self) -> None:
        """A checkpoint holds the index as it is now (as it was loaded, if recount reshaped it)."""
        self.checkpointed_base = self.base if self.reshaped_from is None else self.reshaped_from
        self.reshaped_from = None
        self.checkpointed = len(self.locations)
        self.changed_slots.clear()
        self.overflow_changed = False

    def recount(self) -> None:
        """count and bytes_by_file from the arrays and overflow (an index as a snapshot holds it, before a LiveBytes
        counts it). An overflow
        record of an id inside the dense window (kept by a node of an older version) moves into its slot if that is
        a hole, and is dropped if not: get() answered the slot's record."""
        for entry_id in self.overflow.ids_between(self.base, self.base + len(self.locations) - 1):
            location, length = self.overflow.pop(entry_id)
            if self.locations[entry_id - self.base] == ABSENT:
                self.locations[entry_id - self.base], self.lengths[entry_id - self.base] = location, length
        self._below_window()
        self.bytes_by_file, self.slots_by_file, dense = _file_tallies(self.locations, self.lengths)
        self.count = len(self.overflow) + dense
        for location, length in self.overflow.values():
            self._tally(location, length)

    def _below_window(self) -> None:
        """Every overflow id lies below the window, so that no overflow run ever spans the window's ids (a window that
        moves is adopted as a run: runs may not overlap). An index a node of the version before left may hold ids
        above its window (far ahead of it, then): its window goes to the overflow with them (the runs rebuilt in
        id order), and an empty one starts above them; a checkpoint then writes the index whole (reshaped_from)."""
        end = self.base + len(self.locations)
        if not self.overflow.count or self.overflow.last_id() < end:
            return
        records = list(self.overflow.items())
        window_entries = len(self.locations) - self.locations.count(ABSENT)
        self.overflow = OverflowRuns()
        self.overflow.adopt(self.base, self.locations, self.lengths, window_entries)
        for entry_id, (location, length) in records:
            self.overflow.put(entry_id, location, length)
        self.reshaped_from = self.base
        self.base = records[-1][0] + 1
        self.locations, self.lengths = array("q"), array("i")

    def records_in(self, numbers: Iterable[int]) -> list[tuple[int, int, int]]:
        """(entry id, location, length) of every record indexed here that lies in one of the files `numbers`,
        dense window first, in slot order."""
        wanted = [n for n in numbers if n in self.bytes_by_file]
        if not wanted:
            return []
        found: list[tuple[int, int, int]] = []
        spans = [self.slots_by_file[n] for n in wanted if n in self.slots_by_file]
        if spans:
            low, high = min(span[0] for span in spans), max(span[1] for span in spans)
            # Views of the arrays: none may outlive this step (an array cannot grow while one exists).
            locations = np.frombuffer(self.locations, dtype=np.int64)[low:high + 1]
            slots = np.flatnonzero((locations != ABSENT) & np.isin(locations >> _OFFSET_BITS, wanted))
            lengths = np.frombuffer(self.lengths, dtype=np.int32)[low:high + 1][slots].tolist()
            found.extend(zip((slots + (self.base + low)).tolist(), locations[slots].tolist(), lengths))
            del locations
        if self.overflow:
            found.extend(self.overflow.records_in(wanted))
        return found

    def get(self, entry_id: int) -> tuple[int, int] | None:
        """(packed location, record length) or None if the entry was never stored here."""
        slot = entry_id - self.base
        if 0 <= slot < len(self.locations):
            location = self.locations[slot]
            if location != ABSENT:
                return location, self.lengths[slot]
        return self.overflow.get(entry_id) if self.overflow.count else None

    def entries_between(self, first: int, last: int) -> Iterator[int]:
        """Ids of stored entries in [first, last], ascending, as stored when the iteration starts. A ReadRange sends
        messages while it iterates, and puts land meanwhile: the window it started on is iterated to its end even if
        it moved (its arrays, adopted by the overflow as they are, keep every entry at its slot)."""
        extra = self.overflow.ids_between(first, last) if self.overflow.count else []
        base, locations = self.base, self.locations
        dense_lo = max(first, base)
        dense_hi = min(last, base + len(locations) - 1)
        dense = (
            (base + slot for slot in range(dense_lo - base, dense_hi - base + 1) if locations[slot] != ABSENT)
            if base >= 0 and dense_lo <= dense_hi else iter(())
        )
        if not extra:
            yield from dense
            return
        yield from sorted([*dense, *extra])


class LiveBytes:
    """Over the indexes it counts (those of every ledger the node holds): the bytes of the records they point to per
    file, and which ledgers have records in each file, kept as the indexes change (LedgerIndex._tally), so that
    compaction's plan costs the files and its search for records to move the ledgers in the files it rewrites."""

    __slots__ = ("by_file", "_holders")

    def __init__(self) -> None:
        self.by_file: dict[int, int] = {}      # file number -> live bytes (none: absent)
        self._holders: dict[int, dict[int, object]] = {}   # file number -> {id(owner): owner} with records there

    def attach(self, index: LedgerIndex, owner) -> None:
        """Count index's records, and every change of them from now on, as owner's (its ledger's state)."""
        index.live, index.owner = self, owner
        for number, size in index.bytes_by_file.items():
            self.count(number, size, owner, True)

    def detach(self, index: LedgerIndex) -> None:
        """Stop counting index (its ledger was dropped): none of its records is live any more, whatever still
        changes it (a journal group applied after the drop)."""
        for number, size in index.bytes_by_file.items():
            self.count(number, -size, index.owner, False)
        index.live = index.owner = None

    def count(self, number: int, length: int, owner, held: bool, holding_changed: bool = True) -> None:
        """length bytes more (less when negative) of owner's in file `number`; held: owner has records there still;
        holding_changed: whether that is new (an add's usual tally, to a file the ledger already has records in,
        changes only the bytes: the add path pays a dict update, not the holders' bookkeeping)."""
        total = self.by_file.get(number, 0) + length
        if total:
            self.by_file[number] = total
        else:
            self.by_file.pop(number, None)
        if not holding_changed:
            return
        if held:
            self._holders.setdefault(number, {})[id(owner)] = owner
        elif (holders := self._holders.get(number)) is not None:
            holders.pop(id(owner), None)
            if not holders:
                del self._holders[number]

    def holding(self, numbers: Iterable[int]) -> list:
        """The owners with records in any of the files `numbers`, each once."""
        found: dict[int, object] = {}
        for number in numbers:
            found.update(self._holders.get(number, {}))
        return list(found.values())
