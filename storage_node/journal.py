"""The journal: append-only segment files with group commit, which double as the entry log.

Segments are ``journal/segment-%08d.log``; each record is framed as ``u32 length | u32 crc32c(body) |
body`` and the body starts with a type byte (ENTRY, KEY, FENCE, LAC, DELETE). Garbage collection
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
updated by the flusher in journal order before any waiter of that group is completed.
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
ENTRY_PAYLOAD_OFFSET = FRAME.size + ENTRY_HEAD.size
MAX_BODY = 1 << 30                          # no record is ever this large; a bigger length is damage
_IOV_MAX = 512
_DROP_CHUNK = 4 << 20                       # drop cold pages in steps of at least this much
# fdatasync suffices: the appended data and the file size are what must be durable; the segment's
# directory entry is synced when the segment is created.
_datasync = getattr(os, "fdatasync", os.fsync)


class RecordType(enum.IntEnum):
    ENTRY = 1
    KEY = 2
    FENCE = 3
    LAC = 4
    DELETE = 5


_MIN_BODY = {
    RecordType.ENTRY: ENTRY_HEAD.size,
    RecordType.KEY: KEY_HEAD.size + 1,
    RecordType.FENCE: FENCE_BODY.size,
    RecordType.LAC: LAC_BODY.size,
    RecordType.DELETE: DELETE_BODY.size,
}


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
    """Iterates the valid records of one segment from an offset.

    A damaged record at the end of the last segment with nothing valid after it is a torn write
    from a crash: `torn_at` tells where the valid data ends so the caller truncates there. Any other
    damaged record raises JournalCorruptError naming the file and offset.
    """

    def __init__(self, path: pathlib.Path, start: int, is_last: bool):
        self.path = path
        self.start = start
        self.is_last = is_last
        self.valid_end = start
        self.torn_at: int | None = None
        self.torn_reason = ""

    def records(self) -> Iterator[ScannedRecord]:
        size = self.path.stat().st_size
        if size <= self.start:
            return
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
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
                body = view[pos + FRAME.size:pos + FRAME.size + length]
                try:
                    yield ScannedRecord(pos, FRAME.size + length, body)
                finally:
                    body.release()
                pos += FRAME.size + length
                self.valid_end = pos
                continue
            if self.is_last and not _valid_record_after(data, pos + 1, size):
                self.torn_at = pos
                self.torn_reason = problem
                return
            raise JournalCorruptError(
                f"journal segment {self.path} is damaged at offset {pos} ({problem}) and valid records "
                f"follow it: this is not a torn tail from a crash but corruption in the middle; the node "
                f"refuses to start rather than forget acknowledged entries. Restore the data directory "
                f"from a backup, or decommission this node and let its ledgers re-replicate"
            )


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
        self._open_next()

    def _open_next(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self.segment = self._numbers.take()
        self._fd = os.open(segment_path(self._directory, self.segment), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.size = 0
        self._dropped = 0
        fsync_directory(self._directory)

    def write(self, buffers: list, total: int) -> tuple[int, int]:
        """Write buffers at the end of the current segment and fsync; returns (segment, offset)."""
        if self._broken:
            raise JournalWriteError(self._broken)
        try:
            if self.size >= self._segment_bytes:
                self._open_next()
        except OSError as exc:
            raise JournalWriteError(f"cannot start a new journal segment after {self.segment}: {exc}") from exc
        base = self.size
        try:
            self._write_all(buffers, base, total)
        except OSError as exc:
            self._undo(base, exc)
            raise JournalWriteError(f"journal write failed: {exc}") from exc
        started = time.perf_counter()
        try:
            _datasync(self._fd)
        except OSError as exc:
            # After a failed fsync the page cache state is unknown: never write to this journal again.
            self._broken = f"journal fsync failed earlier ({exc}); restart the node"
            raise JournalWriteError(f"journal fsync failed: {exc}") from exc
        self.fsync_seconds = time.perf_counter() - started
        self.size = base + total
        self._drop_cold_pages()
        return self.segment, base

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

    def _write_all(self, buffers: list, base: int, total: int) -> None:
        written = 0
        pending = list(buffers)
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
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


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
        self.durable = Position(self._writer.segment, 0)
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
            self._failed = f"applying a journal group failed ({exc!r}); restart the node"
            print(f"storage node: {self._failed}", file=sys.stderr, flush=True)
            group.done.set_result(JournalWriteError(self._failed))
            return
        group.done.set_result(None)

    async def close(self) -> None:
        """Flush what was appended, then stop."""
        self._closing = True
        self._wakeup.set()
        await self._flusher
        await self._loop.run_in_executor(self._executor, self._writer.close)
        self._executor.shutdown(wait=True)
