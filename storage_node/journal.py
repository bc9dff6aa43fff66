"""The journal: append-only segment files with group commit, which double as the entry log.

Segments are ``journal/segment-%08d.log``; each record is framed as ``u32 length | u32 crc32c(body) |
body`` and the body starts with a type byte (ENTRY, KEY, FENCE, LAC, DELETE, DURABLE). Garbage collection
(storage_node/compaction.py) copies live entries of sealed segments into ``journal/compacted-%08d.log``
files, which take their numbers from the same sequence (so an index location names one file) and are
never replayed: only the checkpoint points into them.

Why the journal is also the entry log: BookKeeper writes every entry twice (journal, then entry log via
a write cache). Here an entry is written once: the group commit is one write and one fsync for all
records that arrived while the previous group was syncing, and the in-memory index points straight
into the segment (a read is one pread + CRC check). Writing each entry a second time would halve the
disk bandwidth left for 1 MiB entries, whose target is 80% of a raw fsynced file. Checkpoints
(storage_node/checkpoint.py) only snapshot the index, so start-up replays just the journal tail.

Once a group is durable its pages are clean; all but the newest `page_cache_bytes` of the segment are then
dropped from the OS page cache (posix_fadvise DONTNEED, as BookKeeper's journalRemovePagesFromCache does).
Writes then reuse warm pages instead of faulting in fresh ones, which cost the node about three times the
CPU of the write itself; tailing reads of the newest entries still come from memory.

Rule 5: a record is acknowledged only after the fsync of its group; the index and ledger state are
updated by the flusher in journal order before any waiter of that group is completed. A failed write that
cannot be undone, a failed fsync and a failed segment roll (creating the file, syncing its first mark or
the directory entry) all break the journal: the group fails, so does the one gathering behind it, and no
later add is journaled, because the state of what is on disk is unknown; the node then refuses every request
that reads or changes its state until it is restarted (storage.py `refusal`), and replay at the restart
trusts only what is on disk.

Durable marks (torn groups after a power cut): a group is one pwritev acknowledged only after its
fdatasync, so a power cut during it may leave any subset of its pages on disk: damage with valid records
after it, none of them acknowledged. So every group starts with a DURABLE mark, a 17-byte record that
names its own offset; it is written only once the previous group's fdatasync has returned, so a mark found
on disk proves that everything before it in the segment is durable. A new segment starts with a mark
synced at its creation, which also says that the segment carries marks. Replay of the last segment treats
damage after the last mark as the torn last group and truncates it; damage before a mark is corruption of
durable data and stops the node (rule 8). Right after a group's fsync the next group's mark is written
ahead, unsynced (that group rewrites the same bytes): after a process crash the page cache keeps it, so
every acknowledged group lies before a mark; only after a power cut may the last group lack one, and then
damage in it cannot be told apart from a torn write (as a torn last record could not before marks).
Segments written before marks keep the old rule: only damage with nothing valid after it is a torn tail.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import enum
import errno
import mmap
import os
import pathlib
import re
import struct
import sys
import threading
import time
from typing import Awaitable, Callable, Iterator

import crc32c

from storage_node.errors import JournalCorruptError, JournalWriteError

JOURNAL_DIR = "journal"                    # under the data directory
FRAME = struct.Struct("<II")                # body length, crc32c(body)
ENTRY_HEAD = struct.Struct("<BqqqII")       # type, ledger, entry, piggybacked lac, flags, digest; payload follows
KEY_HEAD = struct.Struct("<Bq")             # type, ledger; master key follows
FENCE_BODY = struct.Struct("<Bq")           # type, ledger
LAC_BODY = struct.Struct("<Bqq")            # type, ledger, explicit lac
DELETE_BODY = struct.Struct("<Bq")          # type, ledger (deleted from metadata; garbage collected)
DURABLE_BODY = struct.Struct("<Bq")         # type, its own offset: everything before it in the segment is durable
MARK_SIZE = FRAME.size + DURABLE_BODY.size
ENTRY_PAYLOAD_OFFSET = FRAME.size + ENTRY_HEAD.size
MAX_BODY = 1 << 30                          # no record is ever this large; a bigger length is damage
_IOV_MAX = 512
_DROP_CHUNK = 4 << 20                       # drop cold pages in steps of at least this much
# fdatasync suffices: the appended data and the file size are what must be durable; the segment's
# directory entry is synced when the segment is created (a failure there breaks the journal).
_datasync = getattr(os, "fdatasync", os.fsync)
# Test-only fault injection (issue 15 item 5; the one place it exists): when this environment variable names
# a file (a relative name is taken inside the node's data directory), every group fsync fails with EIO while
# that file exists, as on a failing disk. Read once, when the journal starts; never set in production.
FSYNC_FAULT_ENV = "LEDGER_NODE_TEST_FSYNC_FAULT_FILE"


class RecordType(enum.IntEnum):
    ENTRY = 1
    KEY = 2
    FENCE = 3
    LAC = 4
    DELETE = 5
    DURABLE = 6


_MIN_BODY = {
    RecordType.ENTRY: ENTRY_HEAD.size,
    RecordType.KEY: KEY_HEAD.size + 1,
    RecordType.FENCE: FENCE_BODY.size,
    RecordType.LAC: LAC_BODY.size,
    RecordType.DELETE: DELETE_BODY.size,
    RecordType.DURABLE: DURABLE_BODY.size,
}
# Where a durable mark may start: its length field, then (after the CRC) its type byte. Two length
# fields of one value cannot overlap, so the non-overlapping search finds every mark.
_MARK_CANDIDATE = re.compile(re.escape(struct.pack("<I", DURABLE_BODY.size)) + b"(?=.{4}"
                             + re.escape(bytes([RecordType.DURABLE])) + b")", re.DOTALL)


@dataclasses.dataclass(frozen=True, order=True)
class Position:
    """A place in the journal: everything before it is covered."""

    segment: int
    offset: int


# -- record encoding ----------------------------------------------------------------------------

def encode_entry_head(ledger_id: int, entry_id: int, lac: int, flags: int, digest: int, payload) -> bytes:
    """Frame + body head of an ENTRY record; the payload is written after it unchanged (no copy)."""
    head = ENTRY_HEAD.pack(RecordType.ENTRY, ledger_id, entry_id, lac, flags, digest)
    return FRAME.pack(len(head) + len(payload), crc32c.crc32c(payload, crc32c.crc32c(head))) + head


def _frame(body: bytes) -> bytes:
    return FRAME.pack(len(body), crc32c.crc32c(body)) + body


def encode_key(ledger_id: int, master_key: bytes) -> bytes:
    return _frame(KEY_HEAD.pack(RecordType.KEY, ledger_id) + master_key)


def encode_fence(ledger_id: int) -> bytes:
    return _frame(FENCE_BODY.pack(RecordType.FENCE, ledger_id))


def encode_lac(ledger_id: int, lac: int) -> bytes:
    return _frame(LAC_BODY.pack(RecordType.LAC, ledger_id, lac))


def encode_delete(ledger_id: int) -> bytes:
    return _frame(DELETE_BODY.pack(RecordType.DELETE, ledger_id))


def encode_durable_mark(offset: int) -> bytes:
    """The mark that starts the group written at offset (module docstring: durable marks)."""
    return _frame(DURABLE_BODY.pack(RecordType.DURABLE, offset))


def is_durable_mark(data, pos: int) -> bool:
    """Whether a durable mark naming its own offset stands at pos (a copy elsewhere, say inside a
    payload, names another offset)."""
    return data[pos:pos + MARK_SIZE] == encode_durable_mark(pos)


def frame_problem(data, pos: int, end: int) -> str | None:
    """Why the record at pos is not a valid record, or None if it is."""
    if end - pos < FRAME.size:
        return "partial record header"
    length, crc = FRAME.unpack_from(data, pos)
    if length == 0 or length > MAX_BODY:
        return f"impossible record length {length}"
    body_start = pos + FRAME.size
    if body_start + length > end:
        return f"record of {length} bytes runs past the end of the file"
    body = memoryview(data)[body_start:body_start + length]
    if crc32c.crc32c(body) != crc:
        return "checksum mismatch"
    try:
        kind = RecordType(body[0])
    except ValueError:
        return f"unknown record type {body[0]}"
    if length < _MIN_BODY[kind]:
        return f"{kind.name} record too short ({length} bytes)"
    return None


# -- segment files ------------------------------------------------------------------------------

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


class FileNumbers:
    """Hands out file numbers to the journal writer and to compaction, never the same one twice."""

    def __init__(self, first: int):
        self._next = first
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            number = self._next
            self._next += 1
            return number


def fsync_directory(directory: pathlib.Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- replay -------------------------------------------------------------------------------------

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
    raises JournalCorruptError naming the file and offset.
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


def truncate_segment(path: pathlib.Path, length: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, length)
        os.fsync(fd)
    finally:
        os.close(fd)


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


# -- writing ------------------------------------------------------------------------------------

class SegmentWriter:
    """The segment being appended to. Used only from the flusher's worker thread."""

    def __init__(self, directory: pathlib.Path, numbers: FileNumbers, segment_bytes: int, page_cache_bytes: int):
        self._directory = directory
        self._numbers = numbers
        self._segment_bytes = segment_bytes
        # < 0 (or no posix_fadvise): leave the page cache alone
        self._page_cache_bytes = page_cache_bytes if hasattr(os, "posix_fadvise") else -1
        self._broken: str | None = None
        self._fd = -1
        self._dropped = 0                  # bytes of the segment already dropped from the page cache
        self.segment = 0
        self.size = 0
        self.fsync_seconds = 0.0          # of the last write, for the fsync latency histogram
        fault = os.environ.get(FSYNC_FAULT_ENV)
        self._fsync_fault = directory.parent / fault if fault else None
        self._roll()

    @property
    def broken(self) -> str | None:
        """Why this writer takes no more writes (rule 5), None while it does."""
        return self._broken

    def _roll(self) -> None:
        """Start the next segment; any failure breaks the writer: a segment whose directory entry or
        first mark may not be durable must never hold acknowledged records (rule 5)."""
        number = self._numbers.take()
        try:
            self._start_segment(number)
        except OSError as exc:
            self._broken = (f"starting journal segment {segment_path(self._directory, number)} failed ({exc}): "
                            f"the journal takes no more writes; check the disk, then restart the node")
            raise JournalWriteError(self._broken) from exc

    def _start_segment(self, number: int) -> None:
        self.close()
        self.segment = number
        self.size = self._dropped = 0
        self._fd = os.open(segment_path(self._directory, number), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self._write_all(encode_durable_mark(0), [], 0)
        _datasync(self._fd)
        fsync_directory(self._directory)
        self.size = MARK_SIZE

    def write(self, buffers: list, total: int) -> tuple[int, int]:
        """Write a group (after its durable mark) at the end of the current segment and fsync; returns
        (segment, offset of the group's first record)."""
        if self._broken:
            raise JournalWriteError(self._broken)
        if self.size >= self._segment_bytes:
            self._roll()
        mark_at = self.size
        try:
            self._write_all(encode_durable_mark(mark_at), buffers, total)
        except OSError as exc:
            self._undo(mark_at, exc)
            raise JournalWriteError(f"journal write failed: {exc}") from exc
        started = time.perf_counter()
        try:
            if self._fsync_fault is not None and self._fsync_fault.exists():
                raise OSError(errno.EIO, f"injected by {FSYNC_FAULT_ENV}: {self._fsync_fault} exists")
            _datasync(self._fd)
        except OSError as exc:
            # After a failed fsync what is on disk is unknown (the kernel may have dropped the dirty pages):
            # never write to this journal again, nor serve from it (storage.py); a restart replays the disk.
            self._broken = f"journal fsync failed ({exc}); check the disk, then restart the node"
            raise JournalWriteError(f"journal fsync failed: {exc}") from exc
        self.fsync_seconds = time.perf_counter() - started
        self.size = mark_at + MARK_SIZE + total
        self._mark_ahead()
        self._drop_cold_pages()
        return self.segment, mark_at + MARK_SIZE

    def _mark_ahead(self) -> None:
        """Write the next group's mark now, unsynced (that group rewrites the same bytes): found after a
        crash, it proves this group durable. Best effort: the next write reports any disk error."""
        try:
            os.pwrite(self._fd, encode_durable_mark(self.size), self.size)
        except OSError:
            pass

    def _drop_cold_pages(self) -> None:
        """Best effort: drop the segment's synced (clean) pages older than the newest page_cache_bytes from
        the page cache, in steps of _DROP_CHUNK (every group when page_cache_bytes is 0)."""
        if self._page_cache_bytes < 0:
            return
        cold = self.size - self._page_cache_bytes
        if cold - self._dropped < (_DROP_CHUNK if self._page_cache_bytes else 1):
            return
        try:
            os.posix_fadvise(self._fd, self._dropped, cold - self._dropped, os.POSIX_FADV_DONTNEED)
        except OSError:
            return
        self._dropped = cold

    def _write_all(self, mark: bytes, buffers: list, total: int) -> None:
        """pwritev the durable mark and the buffers at the end of the segment."""
        base = self.size
        total += len(mark)
        written = 0
        pending = [mark, *buffers]
        while pending:
            batch = pending[:_IOV_MAX]
            n = os.pwritev(self._fd, batch, base + written)
            written += n
            pending = _drop_written(pending, n)
        if written != total:
            raise OSError(errno.EIO, f"wrote {written} of {total} bytes")

    def _undo(self, base: int, cause: OSError) -> None:
        try:
            os.ftruncate(self._fd, base)
        except OSError as exc:
            self._broken = f"journal write failed ({cause}) and could not be undone ({exc}); restart the node"

    def close(self) -> None:
        """Close the segment's descriptor; forgotten first, so a failed close is never repeated on a
        number the system may since have handed to someone else."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def _drop_written(buffers: list, n: int) -> list:
    """The buffers still to write after a pwritev that wrote n bytes."""
    for i, buf in enumerate(buffers):
        if n < len(buf):
            rest = buffers[i:]
            if n:
                rest[0] = memoryview(buf)[n:]
            return rest
        n -= len(buf)
    return []


class Group:
    """The records that share one write + fsync. `done` resolves to None (durable) or the error."""

    __slots__ = ("buffers", "size", "records", "items", "done", "started")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.buffers: list = []
        self.size = 0
        self.records = 0
        self.started = 0.0             # perf_counter of the first append: the group's add latency starts here
        self.items: list = []          # what to apply once durable, with offsets relative to the group
        self.done: asyncio.Future = loop.create_future()

    def outcome(self) -> Awaitable:
        """Await this, never `done` itself: a waiter cancelled because its client hung up would otherwise
        cancel `done` for every other waiter and for the flusher, whose set_result would then fail and leave
        the journal taking no more writes."""
        return asyncio.shield(self.done)


class Journal:
    """Group commit: appends go to the current group; one flusher writes and fsyncs a whole group at a
    time in a worker thread (the GIL is released while it syncs) while the next group accumulates.

    apply(segment, base_offset, group, fsync_seconds) runs on the event loop after the fsync, before
    the group's waiters are woken, so the index and ledger state change in journal order (rule 5); it
    also takes the metrics, once per group commit rather than per entry.
    """

    def __init__(self, directory: pathlib.Path, numbers: FileNumbers, segment_bytes: int,
                 apply: Callable[[int, int, Group, float], None],
                 on_write_error: Callable[[JournalWriteError], None], page_cache_bytes: int = -1):
        self._loop = asyncio.get_running_loop()
        self._writer = SegmentWriter(directory, numbers, segment_bytes, page_cache_bytes)
        self._apply = apply
        self._on_write_error = on_write_error
        self._syncing_records = 0
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="journal-fsync")
        self._group = Group(self._loop)
        self._wakeup = asyncio.Event()
        self._closing = False
        self._failed: str | None = None
        self.durable = Position(self._writer.segment, self._writer.size)
        self.fsyncs = 0
        self.records = 0
        self._flusher = self._loop.create_task(self._flush_loop())

    @property
    def group(self) -> Group:
        """The group that accepts appends now; raises if the journal cannot take writes any more."""
        if self._failed or self._closing:
            raise JournalWriteError(self._failed or "the journal is closing: the node is shutting down")
        return self._group

    @property
    def broken(self) -> str | None:
        """Why the journal takes no more writes (a failed fsync, roll or apply; rule 5), None while it does."""
        return self._failed

    @property
    def queued_records(self) -> int:
        """Records appended but not yet durable: the group being synced plus the one gathering."""
        return self._syncing_records + self._group.records

    def append(self, group: Group, *chunks) -> int:
        """Add a record's chunks to group; returns its offset relative to the group start."""
        rel = group.size
        if not rel:
            group.started = time.perf_counter()
        group.buffers.extend(chunks)
        for chunk in chunks:
            group.size += len(chunk)
        group.records += 1
        if not self._wakeup.is_set():
            self._wakeup.set()
        return rel

    async def _flush_loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            group = self._group
            if not group.size:
                if self._closing:
                    return
                continue
            self._group = Group(self._loop)
            if self._closing:
                self._wakeup.set()
            await self._flush(group)

    async def _flush(self, group: Group) -> None:
        self._syncing_records = group.records
        try:
            segment, base = await self._loop.run_in_executor(
                self._executor, self._writer.write, group.buffers, group.size
            )
        except JournalWriteError as exc:
            self._syncing_records = 0
            if self._writer.broken:
                self._break(self._writer.broken)
            self._on_write_error(exc)
            group.done.set_result(exc)
            # The group gathered meanwhile may rely on a KEY or FENCE record of the failed one: fail it
            # too, so nothing durable ever follows a record that was lost.
            dependent, self._group = self._group, Group(self._loop)
            dependent.done.set_result(exc)
            return
        self._syncing_records = 0
        self.durable = Position(segment, base + group.size)
        self.fsyncs += 1
        self.records += group.records
        try:
            self._apply(segment, base, group, self._writer.fsync_seconds)
        except Exception as exc:  # a bug: the in-memory state is now unknown, stop taking writes
            self._break(f"applying a journal group failed ({exc!r}); restart the node")
            failed = JournalWriteError(self._failed)
            self._on_write_error(failed)   # the node says it is broken now, not at its next disk check
            group.done.set_result(failed)
            dependent, self._group = self._group, Group(self._loop)   # as after a failed write: nothing follows
            dependent.done.set_result(failed)
            return
        group.done.set_result(None)

    def _break(self, reason: str) -> None:
        """Take no more writes (rule 5), and say so once."""
        if not self._failed:
            self._failed = reason
            print(f"storage node: {reason}", file=sys.stderr, flush=True)

    async def close(self) -> None:
        """Flush what was appended, then stop."""
        self._closing = True
        self._wakeup.set()
        await self._flusher
        await self._loop.run_in_executor(self._executor, self._writer.close)
        self._executor.shutdown(wait=True)
