"""Where each stored entry of a ledger lives in the journal: entry id -> (segment, offset, length).

Compact: a per-ledger array of packed locations indexed by entry id from the first id stored, with
-1 for entries this node does not hold (striping leaves holes, rule 1). Ids far outside that window
(a recovery add below it, or a huge jump) go to a small dict so no request can make the array huge: the
window grows by at most as many holes as the ledger has stored entries (plus a small allowance), so a
client that adds ids at wide strides costs memory in proportion to what it stored, not to the ids' spread.
"""
from __future__ import annotations

from array import array
from typing import Iterator

_OFFSET_BITS = 40                    # segments up to 1 TiB
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1
_MAX_GAP = 1 << 16                   # grow the dense window by at most this many holes at once
_FREE_HOLES = 1 << 10                # holes allowed at once however few entries are stored
ABSENT = -1


def pack(segment: int, offset: int) -> int:
    return (segment << _OFFSET_BITS) | offset


def unpack(location: int) -> tuple[int, int]:
    return location >> _OFFSET_BITS, location & _OFFSET_MASK


def file_of(location: int) -> int:
    """The segment (or compacted file) number of a packed location."""
    return location >> _OFFSET_BITS


class LedgerIndex:
    __slots__ = ("base", "locations", "lengths", "overflow", "count")

    def __init__(self, base: int = -1):
        self.base = base                         # entry id of locations[0]; -1 until the first put
        self.locations = array("q")
        self.lengths = array("i")
        self.overflow: dict[int, tuple[int, int]] = {}
        self.count = 0                           # stored entries

    def put(self, entry_id: int, location: int, length: int) -> None:
        if self.base < 0:
            self.base = entry_id
        slot = entry_id - self.base
        size = len(self.locations)
        if 0 <= slot < size:
            if self.locations[slot] == ABSENT:
                self.count += 1
            self.locations[slot] = location
            self.lengths[slot] = length
        elif size <= slot and slot - size <= min(_MAX_GAP, max(_FREE_HOLES, self.count)):
            holes = slot - size
            if holes:
                self.locations.extend(array("q", [ABSENT]) * holes)
                self.lengths.extend(array("i", [0]) * holes)
            self.locations.append(location)
            self.lengths.append(length)
            self.count += 1
        else:
            if entry_id not in self.overflow:
                self.count += 1
            self.overflow[entry_id] = (location, length)

    def put_run(self, first_entry_id: int, locations, lengths) -> None:
        """put() of entries first_entry_id, first_entry_id + 1, ... at locations (an array("q")) with lengths;
        in one step when they extend the dense window, as a run of new entries usually does."""
        if self.base < 0:
            self.base = first_entry_id
        slot = first_entry_id - self.base
        size = len(self.locations)
        # put()'s rule for the first entry; every later one then lands at the end of the window.
        if size <= slot and slot - size <= min(_MAX_GAP, max(_FREE_HOLES, self.count)):
            holes = slot - size
            if holes:
                self.locations.extend(array("q", [ABSENT]) * holes)
                self.lengths.extend(array("i", [0]) * holes)
            self.locations.extend(locations)
            self.lengths.extend(lengths)
            self.count += len(lengths)
            return
        for offset, (location, length) in enumerate(zip(locations, lengths)):
            self.put(first_entry_id + offset, location, length)

    def get(self, entry_id: int) -> tuple[int, int] | None:
        """(packed location, record length) or None if the entry was never stored here."""
        slot = entry_id - self.base
        if 0 <= slot < len(self.locations):
            location = self.locations[slot]
            if location != ABSENT:
                return location, self.lengths[slot]
        return self.overflow.get(entry_id)

    def entries_between(self, first: int, last: int) -> Iterator[int]:
        """Ids of stored entries in [first, last], ascending."""
        extra = sorted(e for e in self.overflow if first <= e <= last)
        dense_lo = max(first, self.base)
        dense_hi = min(last, self.base + len(self.locations) - 1)
        dense = (
            (self.base + slot for slot in range(dense_lo - self.base, dense_hi - self.base + 1)
             if self.locations[slot] != ABSENT)
            if self.base >= 0 and dense_lo <= dense_hi else iter(())
        )
        if not extra:
            yield from dense
            return
        yield from sorted([*dense, *extra])
