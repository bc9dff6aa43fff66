"""The row index of an arrow ledger: where its entries' rows start, known without reading the entries.

A read that starts at row k of a ledger fetches only the entries that hold rows >= k (DESIGN rule 15), and
one that ends at row m none past the entry holding m. The writer of an arrow ledger (a Spark write task)
knows the first row of every entry it appends; it stores the index in the ledger's custom metadata
(ROW_INDEX_KEY), in the compare-and-set that closes the ledger (WriteHandle.close), so the planner finds
it in the metadata it reads anyway.

Sparse, so that the ledger znode stays small whatever the ledger's size: the first row of every
stride-th entry, at most MAX_POINTS points (a ledger of up to MAX_POINTS entries is indexed entry by
entry; a 100,000-entry ledger takes about 1 KiB). A read starts at the last indexed entry at or before
row k, so at most stride - 1 entries below k are read for nothing. Encoded as

    1:<entries>:<stride>:<base64 of the LEB128 varints of the deltas between the indexed first rows>

A ledger without an index (written before it existed, or closed by a recovery) is read as before; the
executor then finds its first entry by a binary search over single-entry reads (read.py).
"""
from __future__ import annotations

import base64
import bisect
import dataclasses
import itertools
import logging

from metadata.model import LedgerMetadata

log = logging.getLogger(__name__)

ROW_INDEX_KEY = "rows.index"
MAX_POINTS = 256
VERSION = "1"


@dataclasses.dataclass(frozen=True)
class RowIndex:
    """first_rows[j] is the first row (within the ledger) of entry j * stride; entries is the entry count."""

    entries: int
    stride: int
    first_rows: tuple[int, ...]

    def first_entry(self, row: int) -> int:
        """The entry to start at to read row and the rows after it: no entry before it holds any of them."""
        point = bisect.bisect_right(self.first_rows, row) - 1
        return max(point, 0) * self.stride

    def last_entry(self, row: int) -> int:
        """The last entry to read for the rows up to row: entries after it hold only later rows."""
        point = bisect.bisect_right(self.first_rows, row)
        return self.entries - 1 if point == len(self.first_rows) else point * self.stride - 1

    def encode(self) -> str:
        deltas = (b - a for a, b in zip((0,) + self.first_rows, self.first_rows))
        packed = base64.b64encode(b"".join(_varint(d) for d in deltas)).decode()
        return f"{VERSION}:{self.entries}:{self.stride}:{packed}"

    @classmethod
    def decode(cls, text: str) -> "RowIndex":
        version, entries, stride, packed = text.split(":")
        if version != VERSION:
            raise ValueError(f"row index version {version!r}, this software reads version {VERSION}")
        first_rows = tuple(itertools.accumulate(_varints(base64.b64decode(packed, validate=True))))
        index = cls(int(entries), int(stride), first_rows)
        if index.stride < 1 or len(first_rows) != -(-index.entries // index.stride):
            raise ValueError(f"{len(first_rows)} points for {index.entries} entries at stride {index.stride}")
        return index

    @classmethod
    def of(cls, meta: LedgerMetadata) -> "RowIndex | None":
        """The index in a closed ledger's metadata, if it has one that covers exactly its entries. Without
        one (or with one this software cannot read) the ledger is read as if it had none: slower, as correct."""
        text = meta.custom.get(ROW_INDEX_KEY)
        if text is None or not meta.is_closed:
            return None
        try:
            index = cls.decode(text)
        except ValueError as exc:
            log.warning("ledger %d: row index ignored (%s); reading the ledger without it", meta.ledger_id, exc)
            return None
        if index.entries != meta.last_entry_id + 1:
            log.warning("ledger %d: row index of %d entries ignored, the ledger has %d", meta.ledger_id,
                        index.entries, meta.last_entry_id + 1)
            return None
        return index


class RowIndexBuilder:
    """Takes the first row of every entry in entry order; keeps at most MAX_POINTS points in memory by
    doubling the stride (dropping every other point) whenever they would be more."""

    def __init__(self) -> None:
        self.entries = 0
        self.stride = 1
        self._first_rows: list[int] = []

    def add(self, first_row: int) -> None:
        if self._first_rows and first_row < self._first_rows[-1]:
            raise ValueError(f"entry {self.entries} starts at row {first_row}, before an earlier entry's first row")
        if self.entries % self.stride == 0:
            self._first_rows.append(first_row)
            if len(self._first_rows) > MAX_POINTS:
                self._first_rows = self._first_rows[::2]
                self.stride *= 2
        self.entries += 1

    def index(self) -> RowIndex:
        return RowIndex(self.entries, self.stride, tuple(self._first_rows))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _varints(data: bytes):
    value = shift = 0
    for byte in data:
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            yield value
            value = shift = 0
    if shift:
        raise ValueError("row index ends inside a number")
