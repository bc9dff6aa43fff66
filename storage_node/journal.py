"""The journal writer: group commit into append-only segment files, which double as the entry log.

Records (storage_node/records.py) are appended to the current segment (storage_node/segments.py names the
files, scans them at start-up and reads records back); a segment is rolled once it holds
`--journal-segment-bytes`.

Why the journal is also the entry log: BookKeeper writes every entry twice (journal, then entry log via
a write cache). Here an entry is written once: the group commit is one write and one fsync for all
records that arrived while the previous group was syncing, and the in-memory index points straight
into the segment (a read is one pread + CRC check). Writing each entry a second time would halve the
disk bandwidth left for 1 MiB entries, whose target is 80% of a raw fsynced file. Checkpoints
(storage_node/checkpoint.py) only snapshot the index, so start-up replays just the journal tail.

Once a group is durable its pages are clean; all but the newest `page_cache_bytes` of the segment (by default
none) are then dropped from the OS page cache, whole pages 4 MiB at a time (posix_fadvise DONTNEED, as
BookKeeper's journalRemovePagesFromCache does). Writes then reuse pages just dropped, still warm, instead of
faulting in fresh ones or copying into pages last touched long ago: the kernel's copy into the page cache was
41% of a node's CPU on 1 MiB adds, and a third more keeping the newest 64 MiB than keeping none. Reads of
entries no longer cached come from the disk (and are cached again by it).

Rule 5: a record is acknowledged only after the fsync of its group; the index and ledger state are
updated by the flusher in journal order before any waiter of that group is completed. A failed write that
cannot be undone, a failed fsync and a failed segment roll (creating the file, syncing its first mark or
the directory entry) all break the journal: the group fails, so does the one gathering behind it, and no
later add is journaled, because the state of what is on disk is unknown; the node then refuses every request
that reads or changes its state until it is restarted (storage.py `refusal`), and replay at the restart
trusts only what is on disk. One roll failure does not break it: a full disk (ENOSPC, EDQUOT) while the new
segment is created or its first mark written, before its directory entry is synced. Nothing was ever
acknowledged in that file: it is removed and the next group rolls again, while the node is read-only
until space is freed (storage.py), as after any write that failed for want of space.

Durable marks (torn groups after a power cut): a group is one pwritev acknowledged only after its
fdatasync, so a power cut during it may leave any subset of its pages on disk: damage with valid records
after it, none of them acknowledged. So every group starts with a DURABLE mark, a 17-byte record that
names its own offset; it is written only once the previous group's fdatasync has returned, so a mark found
on disk proves that everything before it in the segment is durable. A new segment starts with a mark
synced at its creation, which also says that the segment carries marks, and, synced with it, a LINK record
naming the segment written before it and that segment's durable end (at a start: the last segment as replay
left it, truncated and synced): replay checks each segment it replays against the one before, so a segment
deleted or cut short at a record boundary is not taken for the end of the journal (storage_node/replay.py).
Right after a group's fsync the next group's mark is written ahead, unsynced (that group rewrites the same
bytes): after a process crash the page cache keeps it, so every acknowledged group lies before a mark. How
replay tells a torn last group from damaged durable data by these marks: storage_node/segments.py.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import logging
import os
import pathlib
import time
from typing import Awaitable, Callable, NoReturn

from storage_node.errors import JournalWriteError
from storage_node.file_modes import FILE_MODE
from storage_node.records import MARK_SIZE, LinkRecord, encode_durable_mark, encode_link
from storage_node.segments import FileNumbers, Position, fsync_directory, segment_path

_log = logging.getLogger(__name__)
_IOV_MAX = 512
_DROP_CHUNK = 4 << 20                       # drop cold pages in steps of at least this much
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# fdatasync suffices: the appended data and the file size are what must be durable; the segment's
# directory entry is synced when the segment is created (a failure there breaks the journal).
_datasync = getattr(os, "fdatasync", os.fsync)
# Test-only fault injection (issue 15 item 5; the one place it exists): when this environment variable names
# a file (a relative name is taken inside the node's data directory), every group fsync fails with EIO while
# that file exists, as on a failing disk. Read once, when the journal starts; never set in production.
FSYNC_FAULT_ENV = "LEDGER_NODE_TEST_FSYNC_FAULT_FILE"


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)   # a write failed for want of space (storage.py: read-only)


# -- writing ------------------------------------------------------------------------------------

class SegmentWriter:
    """The segment being appended to. Used only from the flusher's worker thread."""

    def __init__(self, directory: pathlib.Path, numbers: FileNumbers, segment_bytes: int, page_cache_bytes: int,
                 previous: Position | None = None):
        self._directory = directory
        self._numbers = numbers
        self._segment_bytes = segment_bytes
        # < 0 (or no posix_fadvise): leave the page cache alone
        self._page_cache_bytes = page_cache_bytes if hasattr(os, "posix_fadvise") else -1
        self._broken: str | None = None
        self._unused_number: int | None = None   # a full disk stopped a roll to it: the next roll takes it
        self._fd = -1
        self._dropped = 0                  # bytes of the segment already dropped from the page cache
        self.segment = 0
        self.size = 0
        # What the next segment's LINK names: the segment sealed last and its durable end; at first where the journal
        # on disk ends (previous; None: it holds no segment, named 0).
        self._previous = LinkRecord(previous.segment, previous.offset) if previous else LinkRecord(0, 0)
        self.fsync_seconds = 0.0          # of the last write, for the fsync latency histogram
        fault = os.environ.get(FSYNC_FAULT_ENV)
        self._fsync_fault = directory.parent / fault if fault else None
        # A full disk at the start leaves the writer without a segment, as one stopping a roll later does: the
        # node starts read-only and serves reads (rule 9); the first write after space was freed rolls again.
        # Its position (the unused number, offset 0) is past everything the journal holds, as a checkpoint needs.
        self.full_at_start: JournalWriteError | None = None
        try:
            self._roll()
        except JournalWriteError as exc:
            if self._broken or self._unused_number is None:
                raise
            self.full_at_start = exc

    @property
    def broken(self) -> str | None:
        """Why this writer takes no more writes (rule 5), None while it does."""
        return self._broken

    def _roll(self) -> None:
        """Start the next segment. A failure breaks the writer (a segment whose directory entry or first mark
        may not be durable must never hold acknowledged records, rule 5), except a full disk before the
        directory entry was synced: the new file is removed (it holds no record) and the next write rolls
        again, to the same number (replay takes a gap in the numbers for segments compaction removed); if the
        file cannot be removed, the writer breaks."""
        if self._fd >= 0:                  # not a roll again after a full disk stopped one: this segment is sealed
            self._previous = LinkRecord(self.segment, self.size)
        number = self._numbers.take() if self._unused_number is None else self._unused_number
        self._unused_number = None
        path = segment_path(self._directory, number)
        try:
            self._create_segment(number)
        except OSError as exc:
            with contextlib.suppress(OSError):   # the file is removed or the writer breaks either way
                self.close()
            if exc.errno in DISK_FULL_ERRNOS and self._discard(path):
                self._unused_number = number
                raise JournalWriteError(f"starting journal segment {path} failed ({exc}): the node takes no adds "
                                        "until space is freed") from exc
            self._break(f"starting journal segment {path} failed ({exc})", exc)
        try:
            fsync_directory(self._directory)
        except OSError as exc:
            self._break(f"starting journal segment {path} failed ({exc}) syncing its directory entry", exc)

    def _create_segment(self, number: int) -> None:
        """Create segment `number` with its first mark and its LINK, synced (its directory entry is not yet)."""
        self.close()
        if self.segment != number:      # not a roll again to a number a full disk stopped
            self._numbers.finished(self.segment)    # never written again (FileNumbers: the disk watch)
        self.segment = number
        self.size = self._dropped = 0
        self._fd = os.open(segment_path(self._directory, number), os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                           FILE_MODE)
        link = encode_link(self._previous)
        self._write_all(encode_durable_mark(0), [link], len(link))
        _datasync(self._fd)
        self.size = MARK_SIZE + len(link)

    def _break(self, what: str, cause: OSError) -> NoReturn:
        self._broken = f"{what}: the journal takes no more writes; check the disk, then restart the node"
        raise JournalWriteError(self._broken) from cause

    def _discard(self, path: pathlib.Path) -> bool:
        """Remove a segment file a full disk stopped at its creation; whether it is gone (or never was)."""
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            _log.error("could not remove journal segment %s after a full disk stopped its creation: %s", path, exc)
            return False
        return True

    def write(self, buffers: list, total: int) -> tuple[int, int]:
        """Write a group (after its durable mark) at the end of the current segment and fsync; returns
        (segment, offset of the group's first record)."""
        if self._broken:
            raise JournalWriteError(self._broken)
        if self._fd < 0 or self.size >= self._segment_bytes:   # no segment: a full disk stopped the last roll
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
        if self.size < self._segment_bytes:
            # Not in a full segment: the next group goes to a new one, and this mark, never synced, would end a
            # segment that is no longer the last, where replay takes any damage (a power cut leaving half of it)
            # for corruption and the node would refuse to start.
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
        the page cache, in steps of _DROP_CHUNK, whole pages only (the page a group ends in takes the next
        group's first records: dropped, the next write would read it back from disk)."""
        if self._page_cache_bytes < 0:
            return
        cold = (self.size - self._page_cache_bytes) // _PAGE * _PAGE
        if cold - self._dropped < _DROP_CHUNK:
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
                 on_write_error: Callable[[JournalWriteError], None], page_cache_bytes: int = -1,
                 previous: Position | None = None):
        """previous: where the journal on disk ends (replay's Recovered.journal_end), for the first segment's LINK."""
        self._loop = asyncio.get_running_loop()
        self._writer = SegmentWriter(directory, numbers, segment_bytes, page_cache_bytes, previous)
        self._apply = apply
        self._on_write_error = on_write_error
        self._syncing_records = 0
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="journal-fsync")
        self._group = Group(self._loop)
        self._wakeup = asyncio.Event()
        self._closing = False
        self._failed: str | None = None
        self.durable = Position(self._writer.segment, self._writer.size)
        self.full_at_start = self._writer.full_at_start   # the node starts read-only (Storage.open)
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

    def append_many(self, group: Group, chunks: list, size: int, records: int) -> None:
        """Add several records' chunks (size bytes in all) to group at once; the caller knows their offsets
        (the group's size before the call, then running sums)."""
        if not group.size:
            group.started = time.perf_counter()
        group.buffers.extend(chunks)
        group.size += size
        group.records += records
        if not self._wakeup.is_set():
            self._wakeup.set()

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
            _log.error("%s", reason)

    async def close(self) -> None:
        """Flush what was appended, then stop."""
        self._closing = True
        self._wakeup.set()
        await self._flusher
        await self._loop.run_in_executor(self._executor, self._writer.close)
        self._executor.shutdown(wait=True)
