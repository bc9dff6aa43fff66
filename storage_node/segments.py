"""The files of the journal: their names and numbers, scanning them at start-up, reading records back.

Segments are ``journal/segment-%08d.log``, appended to by the journal writer (storage_node/journal.py).
Garbage collection (storage_node/compaction.py) copies live entries of sealed segments into
``journal/compacted-%08d.log`` files, which take their numbers from the same sequence (so an index location
names one file) and are never replayed: only the checkpoint points into them. A `Position` is a place in
that sequence; reads go through `SegmentReaders`, one read-only descriptor per file.

Torn groups after a crash (rule 8: never forget what was acknowledged, never serve what was not). Every
group the writer appends starts with a durable mark, and a mark is written only once everything before it
is durable (storage_node/journal.py: durable marks); a segment with marks starts with one. So when start-up
replay (storage_node/replay.py) scans the last segment, damage after its last mark is the torn last group,
never acknowledged, and is truncated away; damage before a mark is corruption of durable data and stops the
node. Only after a power cut may the last group lack a mark, and then damage in it cannot be told apart from
a torn write (as a torn last record could not before marks). Segments written before marks keep the old
rule: only damage with nothing valid after it is a torn tail. Damage in any other segment stops the node.
"""
from __future__ import annotations

import dataclasses
import mmap
import os
import pathlib
import re
import struct
import threading
from typing import Iterator

from storage_node.errors import JournalCorruptError
from storage_node.records import DURABLE_BODY, FRAME, RecordType, frame_problem, is_durable_mark

JOURNAL_DIR = "journal"                    # under the data directory
# Where a durable mark may start: its length field, then (after the CRC) its type byte. Two length
# fields of one value cannot overlap, so the non-overlapping search finds every mark.
_MARK_CANDIDATE = re.compile(re.escape(struct.pack("<I", DURABLE_BODY.size)) + b"(?=.{4}"
                             + re.escape(bytes([RecordType.DURABLE])) + b")", re.DOTALL)


@dataclasses.dataclass(frozen=True, order=True)
class Position:
    """A place in the journal: everything before it is covered."""

    segment: int
    offset: int


# -- names and numbers --------------------------------------------------------------------------

def segment_path(directory: pathlib.Path, segment: int) -> pathlib.Path:
    return directory / f"segment-{segment:08d}.log"


def compacted_path(directory: pathlib.Path, number: int) -> pathlib.Path:
    return directory / f"compacted-{number:08d}.log"


def data_file_path(directory: pathlib.Path, number: int) -> pathlib.Path:
    """The file an index location with this number points into: a journal segment or a compacted file."""
    path = segment_path(directory, number)
    return path if path.exists() else compacted_path(directory, number)


def _list_numbered(directory: pathlib.Path, prefix: str) -> list[int]:
    if not directory.exists():
        return []
    numbers = []
    for path in directory.glob(f"{prefix}-*.log"):
        try:
            numbers.append(int(path.stem.split("-", 1)[1]))
        except ValueError:
            continue
    return sorted(numbers)


def list_segments(directory: pathlib.Path) -> list[int]:
    return _list_numbered(directory, "segment")


def list_compacted(directory: pathlib.Path) -> list[int]:
    return _list_numbered(directory, "compacted")


def data_file_number(name: str) -> int | None:
    """The number of a journal segment or compacted file named `name`, None for any other name."""
    match = _DATA_FILE_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


_DATA_FILE_NAME = re.compile(r"(?:segment|compacted)-(\d+)\.log")


class FileNumbers:
    """Hands out file numbers to the journal writer and to compaction, never the same one twice, and knows which
    of them may still be written to: a number is being written from take() until its taker's finished() (the
    writer rolled past the segment; compaction's copy ended). The disk watch stats the files of the other numbers
    only once (storage_node/disk_usage.py); a finished() never said only costs it a stat at every check."""

    def __init__(self, first: int):
        self._next = first
        self._writing: set[int] = set()
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            number = self._next
            self._next += 1
            self._writing.add(number)
            return number

    def finished(self, number: int) -> None:
        """Nothing writes to file `number` any more."""
        with self._lock:
            self._writing.discard(number)

    def written(self) -> tuple[int, frozenset[int]]:
        """(taken_below, writing), read at one moment: the file of a number below taken_below and not in writing
        never changes again (it may be deleted)."""
        with self._lock:
            return self._next, frozenset(self._writing)


def fsync_directory(directory: pathlib.Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- scanning at start-up -----------------------------------------------------------------------

@dataclasses.dataclass
class ScannedRecord:
    offset: int          # of the frame within the segment
    length: int          # frame + body
    body: memoryview


class SegmentScan:
    """Iterates the valid records of one segment from an offset (durable marks are consumed, not yielded).

    Damage in the last segment may be a torn write from a crash: `torn_at` tells where the valid data
    ends so the caller truncates there. It is torn when it lies after the last durable mark (a segment
    with marks) or, in a segment from before marks, when nothing valid follows it. Any other damage
    raises JournalCorruptError naming the file and offset (module docstring: torn groups).
    """

    def __init__(self, path: pathlib.Path, start: int, is_last: bool):
        self.path = path
        self.start = start
        self.is_last = is_last
        self.marked = False              # the segment starts with a durable mark
        self.valid_end = start
        self.torn_at: int | None = None
        self.torn_reason = ""

    def records(self) -> Iterator[ScannedRecord]:
        size = self.path.stat().st_size
        if size <= self.start:
            return
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            self.marked = is_durable_mark(data, 0)
            view = memoryview(data)
            try:
                yield from self._scan(data, view, size)
            finally:
                view.release()

    def _scan(self, data, view: memoryview, size: int) -> Iterator[ScannedRecord]:
        pos = self.start
        while pos < size:
            problem = frame_problem(data, pos, size)
            if problem is None:
                length = FRAME.unpack_from(data, pos)[0]
                if data[pos + FRAME.size] != RecordType.DURABLE:
                    body = view[pos + FRAME.size:pos + FRAME.size + length]
                    try:
                        yield ScannedRecord(pos, FRAME.size + length, body)
                    finally:
                        body.release()
                pos += FRAME.size + length
                self.valid_end = pos
                continue
            if self.is_last and self._torn(data, pos, size):
                self.torn_at = pos
                self.torn_reason = problem
                return
            raise JournalCorruptError(self._corrupt(pos, problem))

    def _torn(self, data, pos: int, size: int) -> bool:
        """Whether damage at pos in the last segment is a write that never completed before a crash."""
        if self.marked:
            return _durable_mark_after(data, pos, size) is None
        return not _valid_record_after(data, pos + 1, size)

    def _corrupt(self, pos: int, problem: str) -> str:
        if not self.is_last:
            why = "it is not the last segment, whose tail alone a crash can tear"
        elif self.marked:
            why = "a durable mark follows it, so it was durable, not a group torn by a crash"
        else:
            why = "valid records follow it: this is not a torn tail from a crash but corruption in the middle"
        return (f"journal segment {self.path} is damaged at offset {pos} ({problem}) and {why}; the node "
                f"refuses to start rather than forget acknowledged entries. Restore the data directory from "
                f"a backup, or decommission this node and let its ledgers re-replicate")


def _durable_mark_after(data, pos: int, end: int) -> int | None:
    """The offset of the first durable mark after pos, None if there is none."""
    for match in _MARK_CANDIDATE.finditer(data, pos + 1, end):
        if is_durable_mark(data, match.start()):
            return match.start()
    return None


def _valid_record_after(data, start: int, end: int) -> bool:
    if not bytes(data[start:end]).strip(b"\0"):
        return False
    return any(frame_problem(data, pos, end) is None for pos in range(start, end - FRAME.size))


def seal_segment(path: pathlib.Path, length: int) -> None:
    """Cut the segment at length (where its valid records end: a torn tail goes) and sync it. Replay seals the last
    segment before the writer's next segment names its end in a LINK: the mark the last process wrote ahead may
    still be only in the page cache, and a power cut would leave the segment short of that end."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, length)
        os.fsync(fd)
    finally:
        os.close(fd)


# -- reading records back -----------------------------------------------------------------------

def read_record(fd: int, offset: int, length: int) -> bytes:
    """One pread of a whole frame, verified; raises OSError or ValueError (with the reason)."""
    data = os.pread(fd, length, offset)
    if len(data) != length:
        raise ValueError(f"short read: {len(data)} of {length} bytes")
    problem = frame_problem(data, 0, length)
    if problem is not None:
        raise ValueError(problem)
    if FRAME.unpack_from(data, 0)[0] + FRAME.size != length:
        raise ValueError("record length differs from the index")
    return data


class SegmentReaders:
    """Read-only descriptors of segments and compacted files, opened on first use (pread is thread-safe)."""

    def __init__(self, directory: pathlib.Path):
        self._directory = directory
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()

    def fd(self, segment: int) -> int:
        fd = self._fds.get(segment)
        if fd is None:
            with self._lock:
                fd = self._fds.get(segment)
                if fd is None:
                    fd = os.open(data_file_path(self._directory, segment), os.O_RDONLY)
                    self._fds[segment] = fd
        return fd

    def forget(self, segment: int) -> None:
        """Close the descriptor of a file that compaction deleted (no index entry points into it)."""
        with self._lock:
            fd = self._fds.pop(segment, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
