"""What the node's files take on disk, at a cost that does not grow with their number: the disk watch's use of the
data directory (rule 9, the registration's disk use; storage_node/node.py) and the data_bytes metric.

A node of 5 TB holds some 10,000 journal files of 512 MiB and up to MAX_DELTAS checkpoint deltas; a walk that
stats each of them every second costs tens of milliseconds of CPU, most of it holding the GIL. But nearly all of
them can no longer change, so each is stat'ed once and its size remembered:
- the journal's files by number (storage_node/segments.py: one sequence for segments and compacted files).
  FileNumbers knows which numbers are still being written: the segment the journal appends to, the compacted file
  a copy fills. The others never change again; the files of new numbers are found by their numbers (FileNumbers
  hands them out), deleted ones are stat'ed again when compaction says it deleted them (look_again), so the
  journal directory is listed only once, at the first check.
- checkpoint deltas (storage_node/checkpoint.py: delta_of): complete once renamed into place, never rewritten.
- everything else in the data directory (the snapshot, COOKIE, LOCK, temporary files, a file someone else put
  there) is stat'ed at every check. The data directory and its other subdirectories are listed again only when
  their modification stamp changed, or when it had changed less than _SETTLED_NS before they were last listed (a
  name added within the same tick of the file system's clock would not change the stamp again).
A check therefore stats the directories, the files still written and the few others, and REFRESH_PER_CHECK of the
remembered files in turn: a file's allocated blocks may still change after its last write (XFS trims the space
it preallocated; a file removed behind the node's back), and the turns correct that within a full cycle.

The number is what the walk it replaces measured (storage_node/node.py before): the allocated blocks of every file
under the data directory, as du counts them (st_blocks * 512); data_bytes is the sizes of the journal's files.
A file put into the journal directory by someone else while the node runs is counted from the next start only.
"""
from __future__ import annotations

import collections
import os
import pathlib
import threading
import time
from typing import NamedTuple

from storage_node.checkpoint import delta_of
from storage_node.segments import FileNumbers, compacted_path, data_file_number, segment_path

REFRESH_PER_CHECK = 8               # remembered files stat'ed again at each check, in turn
_SETTLED_NS = 2_000_000_000         # a listing this long after its directory's last change holds every name in it


class FilesUsage(NamedTuple):
    allocated_bytes: int            # what the files under the data directory take (as du counts them)
    journal_bytes: int              # the sizes of the journal's segments and compacted files


class _Remembered:
    """Files that do not change any more, stat'ed once: path -> (allocated bytes, size), with their totals, and the
    order in which refresh() stats a few of them again."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[int, int]] = {}
        self.allocated = 0
        self.size = 0
        self._turns: collections.deque[str] = collections.deque()

    def put(self, path: str, st: os.stat_result) -> None:
        self.drop(path)
        self.files[path] = found = (st.st_blocks * 512, st.st_size)
        self.allocated += found[0]
        self.size += found[1]
        self._turns.append(path)

    def drop(self, path: str) -> None:
        """Forget path (its turn goes when it comes)."""
        found = self.files.pop(path, None)
        if found is not None:
            self.allocated -= found[0]
            self.size -= found[1]

    def refresh(self, count: int) -> None:
        """Stat the next `count` files again (each at most once)."""
        for _ in range(min(count, len(self.files))):
            while (path := self._turns.popleft()) not in self.files:
                pass                                # dropped since: its turn is gone
            st = _lstat(path)
            if st is None:
                self.drop(path)
            else:
                self.put(path, st)


class _Listing(NamedTuple):
    stamp: tuple[int, int, int]     # the directory's inode, mtime and ctime when it was listed
    settled: bool                   # listed _SETTLED_NS after its last change: no later change can keep the stamp
    others: tuple[str, ...]         # paths of the files stat'ed at every check
    remembered: frozenset[str]      # paths of the files remembered
    subdirectories: tuple[str, ...]


class DataDirUsage:
    """The files under data_dir, measured by measure() (blocking; one caller at a time, in a worker thread)."""

    def __init__(self, data_dir: pathlib.Path, journal_dir: pathlib.Path, numbers: FileNumbers):
        self._data_dir = str(data_dir)
        self._journal_dir = journal_dir
        self._numbers = numbers
        self._journal = _Remembered()           # journal files that are written no more
        self._others = _Remembered()            # checkpoint deltas
        self._listings: dict[str, _Listing] = {}
        self._unsealed: set[int] | None = None  # journal numbers to stat at every check (None: not listed yet)
        self._journal_others: tuple[str, ...] = ()   # files of other names in the journal directory
        self._next_number = 0                   # the files of the numbers below are known
        self._look_again: set[int] = set()
        self._lock = threading.Lock()
        self.last = FilesUsage(0, 0)            # of the last measure(), for the metrics (read from their thread)

    def look_again(self, numbers) -> None:
        """The journal files of these numbers were deleted (or may have been): the next check stats them again.
        Safe from any thread."""
        with self._lock:
            self._look_again.update(numbers)

    def measure(self) -> FilesUsage:
        allocated, journal_bytes = self._measure_journal()
        allocated += self._measure_listed(self._data_dir)
        self._journal.refresh(REFRESH_PER_CHECK)
        self._others.refresh(REFRESH_PER_CHECK)
        self.last = FilesUsage(allocated + self._journal.allocated + self._others.allocated,
                               journal_bytes + self._journal.size)
        return self.last

    def _measure_journal(self) -> tuple[int, int]:
        """(allocated bytes, size) of the journal's files still written or not stat'ed before; those written no
        more are remembered on the way."""
        taken_below, writing = self._numbers.written()
        if self._unsealed is None:
            # Listed after written(): a number taken before whose file is not there yet is being written.
            listed = self._list_journal()
            if listed is None:
                return 0, 0      # not listed (EMFILE, EIO): counted from the next check that lists it
            self._unsealed, self._journal_others = listed
            self._unsealed |= writing
            self._next_number = taken_below
        unsealed = self._unsealed
        unsealed.update(range(self._next_number, taken_below))
        self._next_number = max(self._next_number, taken_below)
        with self._lock:
            again, self._look_again = self._look_again, set()
        for number in again:
            for path in self._paths(number):
                self._journal.drop(path)
        unsealed |= again
        allocated = size = 0
        for number in sorted(unsealed):
            path, st = self._find(number)
            if number < taken_below and number not in writing:
                unsealed.discard(number)
                if st is not None:
                    self._journal.put(path, st)
            elif st is not None:
                allocated += st.st_blocks * 512
                size += st.st_size
        for path in self._journal_others:
            if (st := _lstat(path)) is not None:
                allocated += st.st_blocks * 512
        return allocated, size

    def _list_journal(self) -> tuple[set[int], tuple[str, ...]] | None:
        """The numbers of the journal's files and the paths of the directory's other files, listed once; None when
        the listing failed."""
        numbers, others = set(), []
        try:
            entries = list(os.scandir(self._journal_dir))
        except OSError:
            return None
        for entry in entries:
            number = data_file_number(entry.name)
            if number is not None:
                numbers.add(number)
            elif not entry.is_dir(follow_symlinks=False):
                others.append(entry.path)
        return numbers, tuple(others)

    def _paths(self, number: int) -> tuple[str, str]:
        return str(segment_path(self._journal_dir, number)), str(compacted_path(self._journal_dir, number))

    def _find(self, number: int) -> tuple[str, os.stat_result | None]:
        """The file of a journal number and its stat (None: there is none, or no more)."""
        path = ""
        for path in self._paths(number):
            if (st := _lstat(path)) is not None:
                return path, st
        return path, None

    def _measure_listed(self, directory: str) -> int:
        """Allocated bytes of the files under directory that are not remembered; the journal's are measured apart."""
        try:
            st = os.stat(directory)
        except OSError:
            return 0
        stamp = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        listing = self._listings.get(directory)
        if listing is None or listing.stamp != stamp or not listing.settled:
            listing = self._list(directory, stamp, max(st.st_mtime_ns, st.st_ctime_ns), listing)
        allocated = 0
        for path in listing.others:
            if (found := _lstat(path)) is not None:
                allocated += found.st_blocks * 512
        for path in listing.subdirectories:
            if path != str(self._journal_dir):
                allocated += self._measure_listed(path)
        return allocated

    def _list(self, directory: str, stamp: tuple[int, int, int], changed_ns: int,
              before: _Listing | None) -> _Listing:
        """List directory again: its files of names that never change are stat'ed if they are new."""
        settled = time.time_ns() - changed_ns >= _SETTLED_NS        # read before the names are
        others, remembered, subdirectories = [], set(), []
        try:
            entries = list(os.scandir(directory))
        except OSError:
            # Removed since its stat, or not readable now (EMFILE, EIO): nothing of it counted this check (as
            # os.walk did), and nothing kept: the next check lists it again.
            return before or _Listing(stamp, False, (), frozenset(), ())
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                subdirectories.append(entry.path)
            elif directory == self._data_dir and delta_of(entry.name) is not None:
                remembered.add(entry.path)
                if entry.path not in self._others.files and (found := _lstat(entry.path)) is not None:
                    self._others.put(entry.path, found)
            else:
                others.append(entry.path)
        for path in (before.remembered - remembered) if before is not None else ():
            self._others.drop(path)
        listing = self._listings[directory] = _Listing(stamp, settled, tuple(others), frozenset(remembered),
                                                       tuple(subdirectories))
        return listing


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
