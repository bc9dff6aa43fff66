"""Journal framing, writing and replay without processes: torn tails and torn last groups are dropped,
damage before a durable mark or in the middle of a segment from before marks is fatal, and a journal
whose segment roll failed takes no more writes, unless a full disk stopped it before anything of it was durable."""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import mmap
import os
import pathlib
import sys
import threading

import pytest

from protos import ledger_pb2 as pb
from storage_node.checkpoint import SNAPSHOT_NAME, decode_snapshot, encode_snapshot, save_snapshot
from storage_node.entry_index import LedgerIndex, pack, unpack
from storage_node import journal as journal_module
from storage_node.errors import JournalCorruptError, JournalWriteError
from storage_node.journal import Journal, SegmentWriter
from storage_node.ledger_state import LedgerState
from storage_node.records import (
    ENTRY_PAYLOAD_OFFSET,
    MARK_SIZE,
    LinkRecord,
    encode_durable_mark,
    encode_entry_head,
    encode_fence,
    encode_key,
    encode_lac,
    encode_link,
    frame_problem,
)
from storage_node.replay import recover
from storage_node.segments import FileNumbers, Position, SegmentReaders, SegmentScan, read_record, segment_path

KEY = b"k" * 32


def entry_record(ledger_id: int, entry_id: int, payload: bytes) -> bytes:
    return encode_entry_head(ledger_id, entry_id, entry_id - 1, 0, 1234, payload) + payload


def write_segment(journal_dir: pathlib.Path, number: int, *records: bytes) -> pathlib.Path:
    journal_dir.mkdir(parents=True, exist_ok=True)
    path = segment_path(journal_dir, number)
    path.write_bytes(b"".join(records))
    return path


def test_every_record_type_round_trips_through_a_scan(tmp_path):
    records = [encode_key(7, KEY), entry_record(7, 0, b"hello"), encode_fence(7), encode_lac(7, 0)]
    path = write_segment(tmp_path, 1, *records)
    scan = SegmentScan(path, 0, is_last=True)
    scanned = [(r.offset, r.length, r.body[0]) for r in scan.records()]
    offsets = [sum(map(len, records[:i])) for i in range(len(records))]
    assert scanned == [(o, len(r), kind) for o, r, kind in zip(offsets, records, (2, 1, 3, 4))]
    assert scan.valid_end == path.stat().st_size and scan.torn_at is None


@pytest.mark.parametrize("page_cache_bytes", [-1, 0, 300 * 1024])
def test_dropping_synced_pages_from_the_cache_loses_nothing_across_segment_rolls(tmp_path, page_cache_bytes):
    writer = SegmentWriter(tmp_path, FileNumbers(1), segment_bytes=1 << 20, page_cache_bytes=page_cache_bytes)
    written = []
    for entry_id in range(40):
        record = entry_record(3, entry_id, bytes([entry_id]) * 100_000)
        segment, offset = writer.write([record], len(record))
        written.append((segment, offset, record))
    writer.close()
    assert len({segment for segment, _, _ in written}) >= 3
    readers = SegmentReaders(tmp_path)
    try:
        for segment, offset, record in written:
            assert read_record(readers.fd(segment), offset, len(record)) == record
    finally:
        readers.close()


def _resident_pages(path) -> list[bool]:
    """Which pages of the file are in the page cache (mincore over a read-only mapping)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    size, page = path.stat().st_size, mmap.PAGESIZE
    pages = (size + page - 1) // page
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vector = ctypes.create_string_buffer(pages)
            assert libc.mincore(address, size, vector) == 0, os.strerror(ctypes.get_errno())
            return [byte & 1 == 1 for byte in vector.raw]
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "posix_fadvise") or not sys.platform.startswith("linux"),
                    reason="posix_fadvise and mincore")
def test_synced_groups_leave_the_page_cache_in_whole_pages_and_steps(tmp_path):
    """By default (0) a synced group's pages are dropped once 4 MiB have gathered, but never the page the
    newest group ends in: the next group writes into it, and would have to read it back from disk."""
    probe = tmp_path / "probe"
    probe.write_bytes(b"p" * mmap.PAGESIZE)
    with open(probe, "rb+") as handle:
        os.fsync(handle.fileno())      # clean: a dirty page is never dropped
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    if _resident_pages(probe)[0]:
        pytest.skip(f"{tmp_path}'s filesystem keeps clean pages it is told to drop (tmpfs)")
    writer = SegmentWriter(tmp_path, FileNumbers(1), segment_bytes=1 << 30, page_cache_bytes=0)
    record = entry_record(3, 0, b"x" * 10_000)          # records (and groups) end inside pages
    ends = []
    for _ in range(450):                                 # about 4.3 MiB
        writer.write([record], len(record))
        ends.append(writer.size)
    writer.close()
    resident = _resident_pages(segment_path(tmp_path, 1))
    whole_pages = [end // mmap.PAGESIZE * mmap.PAGESIZE for end in ends]
    dropped_up_to = next(end for end in whole_pages if end >= journal_module._DROP_CHUNK)   # the one drop
    assert not any(resident[:dropped_up_to // mmap.PAGESIZE])
    assert all(resident[dropped_up_to // mmap.PAGESIZE:])


def test_entry_payload_sits_at_a_fixed_offset_in_its_record():
    record = entry_record(1, 2, b"payload")
    assert record[ENTRY_PAYLOAD_OFFSET:] == b"payload"
    assert frame_problem(record, 0, len(record)) is None


@pytest.mark.parametrize("damage", ["partial header", "partial body", "bad checksum", "zeros"])
def test_a_torn_tail_of_the_last_segment_is_recognised(tmp_path, damage):
    good = encode_key(7, KEY) + entry_record(7, 0, b"x" * 100)
    torn = entry_record(7, 1, b"y" * 100)
    tail = {
        "partial header": torn[:5],
        "partial body": torn[:-10],
        "bad checksum": torn[:-1] + bytes([torn[-1] ^ 0xFF]),
        "zeros": bytes(300),
    }[damage]
    path = write_segment(tmp_path, 1, good, tail)
    scan = SegmentScan(path, 0, is_last=True)
    assert len(list(scan.records())) == 2
    assert scan.torn_at == len(good)


def test_garbage_followed_by_valid_records_is_corruption(tmp_path):
    good = encode_key(7, KEY) + entry_record(7, 0, b"x" * 100)
    path = write_segment(tmp_path, 1, good, b"\x01garbage!" * 3, entry_record(7, 1, b"z" * 50))
    with pytest.raises(JournalCorruptError, match=f"{path}.*offset {len(good)}"):
        list(SegmentScan(path, 0, is_last=True).records())


def test_a_torn_record_in_an_earlier_segment_is_corruption(tmp_path):
    path = write_segment(tmp_path, 1, encode_key(7, KEY), entry_record(7, 0, b"x")[:-3])
    with pytest.raises(JournalCorruptError):
        list(SegmentScan(path, 0, is_last=False).records())


def test_replay_restores_entries_keys_fences_and_lacs_and_truncates_a_torn_tail(tmp_path):
    journal = tmp_path / "journal"
    write_segment(journal, 1, encode_key(7, KEY), entry_record(7, 0, b"a"), entry_record(7, 1, b"b"))
    torn = entry_record(7, 3, b"d" * 40)[:20]
    last = write_segment(journal, 2, encode_key(9, b"other"), encode_fence(9), encode_lac(7, 1),
                         entry_record(7, 2, b"c"), torn)
    valid_length = last.stat().st_size - len(torn)
    recovered = recover(tmp_path, journal)
    ledger7, ledger9 = recovered.ledgers[7], recovered.ledgers[9]
    assert ledger7.master_key == KEY and not ledger7.fenced
    assert (ledger7.last_entry_id, ledger7.last_add_confirmed) == (2, 1)
    assert [e for e in ledger7.index.entries_between(0, 10)] == [0, 1, 2]
    assert ledger9.fenced and ledger9.master_key == b"other" and ledger9.index.count == 0
    assert recovered.next_segment == 3
    assert last.stat().st_size == valid_length
    assert any("torn" in note for note in recovered.notes)


def test_replay_starts_from_the_checkpoint_and_ignores_a_damaged_one(tmp_path):
    journal = tmp_path / "journal"
    first = encode_key(7, KEY) + entry_record(7, 0, b"a")
    write_segment(journal, 1, first, entry_record(7, 1, b"b"))
    state = LedgerState(7, KEY, last_entry_id=0, last_add_confirmed=-1)
    state.index.put(0, pack(1, len(encode_key(7, KEY))), len(entry_record(7, 0, b"a")))
    save_snapshot(tmp_path, encode_snapshot(Position(1, len(first)), {7: state}, generation=1))
    assert sorted(recover(tmp_path, journal).ledgers[7].index.entries_between(0, 5)) == [0, 1]

    snapshot = tmp_path / SNAPSHOT_NAME
    blob = snapshot.read_bytes()
    snapshot.write_bytes(blob[:-1] + bytes([blob[-1] ^ 0xFF]))
    recovered = recover(tmp_path, journal)
    assert sorted(recovered.ledgers[7].index.entries_between(0, 5)) == [0, 1]
    assert any("damaged checkpoint" in note for note in recovered.notes)


def test_snapshot_round_trips_sparse_and_far_entries():
    state = LedgerState(3, KEY, fenced=True, last_add_confirmed=4, last_entry_id=1 << 40)
    for entry_id in (0, 2, 5, 1 << 40):
        state.index.put(entry_id, pack(2, entry_id % 1000), 77)
    position, ledgers = decode_snapshot(bytes(encode_snapshot(Position(2, 99), {3: state}, generation=1)))
    loaded = ledgers[3]
    assert position == Position(2, 99)
    assert (loaded.fenced, loaded.last_add_confirmed, loaded.last_entry_id) == (True, 4, 1 << 40)
    assert list(loaded.index.entries_between(0, 1 << 41)) == [0, 2, 5, 1 << 40]
    assert loaded.index.count == 4
    assert unpack(loaded.index.get(5)[0]) == (2, 5)


def test_index_answers_absent_for_holes_and_out_of_window_ids():
    index = LedgerIndex()
    index.put(10, 1, 1)
    index.put(12, 2, 1)
    index.put(3, 3, 1)
    assert index.get(11) is None and index.get(9) is None and index.get(10) == (1, 1)
    assert list(index.entries_between(0, 100)) == [3, 10, 12]


def test_ledger_state_rules_six_and_seven():
    state = LedgerState(1, KEY)
    assert state.check_add(b"wrong", recovery=False)[0] == pb.UNAUTHORIZED
    assert state.check_fence(b"wrong")[0] == pb.UNAUTHORIZED
    assert state.check_add(KEY, recovery=False) is None
    state.fenced = True
    assert state.check_add(KEY, recovery=False)[0] == pb.FENCED
    assert state.check_add(KEY, recovery=True) is None
    assert state.check_write_lac(KEY)[0] == pb.FENCED


# -- durable marks: a torn last group is dropped, damage before a mark is fatal (issue 13, item 6) --------

def write_groups(journal_dir: pathlib.Path, *groups: list[bytes],
                 synced: bool = False) -> tuple[pathlib.Path, list[int]]:
    """Segment 1 as the node writes it, one group per list of records; returns it and each record's offset.

    Unless synced, the file is cut where it was while the last group's fsync was still running: without
    the mark written ahead once that fsync returns (a power cut then may tear the last group)."""
    journal_dir.mkdir(parents=True, exist_ok=True)
    writer = SegmentWriter(journal_dir, FileNumbers(1), segment_bytes=1 << 30, page_cache_bytes=-1)
    offsets = []
    for records in groups:
        segment, base = writer.write(list(records), sum(map(len, records)))
        offsets.extend(base + sum(map(len, records[:i])) for i in range(len(records)))
    writer.close()
    path = segment_path(journal_dir, segment)
    assert path.read_bytes()[writer.size:] == encode_durable_mark(writer.size)
    if not synced:
        os.truncate(path, writer.size)
    return path, offsets


def damage(path: pathlib.Path, offset: int, length: int) -> None:
    """A page that never reached the disk reads as zeros."""
    data = bytearray(path.read_bytes())
    data[offset:offset + length] = bytes(length)
    path.write_bytes(bytes(data))


def test_the_writer_starts_the_segment_and_every_group_with_a_durable_mark(tmp_path):
    path, offsets = write_groups(tmp_path, [encode_key(7, KEY)], [entry_record(7, 0, b"a"), entry_record(7, 1, b"b")])
    data = path.read_bytes()
    link = encode_link(LinkRecord(0, 0))                          # synced with the first mark; the journal's first
    first_group = MARK_SIZE + len(link)                           # segment follows none
    second_group = offsets[1] - MARK_SIZE
    assert data[:MARK_SIZE] == encode_durable_mark(0)
    assert data[MARK_SIZE:first_group] == link
    assert data[first_group:first_group + MARK_SIZE] == encode_durable_mark(first_group)
    assert data[second_group:offsets[1]] == encode_durable_mark(second_group)
    scan = SegmentScan(path, 0, is_last=True)
    assert [r.offset for r in scan.records()] == [MARK_SIZE] + offsets     # marks are consumed, not replayed
    assert scan.marked and scan.torn_at is None


def test_a_sealed_segment_is_synced_whole_before_the_next_one_starts(tmp_path, monkeypatch):
    """Storage audit 2026-11-29: every group writes the next group's mark ahead, unsynced; at a roll that mark ended
    the sealed segment unsynced, and a power cut could leave it half there in a segment that is no longer the last,
    where replay takes any damage for corruption: the node refused to start. A full segment gets no mark ahead."""
    synced: dict[int, int] = {}     # inode -> file size at its last fdatasync

    def datasync(fd):
        os.fdatasync(fd)
        stat = os.fstat(fd)
        synced[stat.st_ino] = stat.st_size

    monkeypatch.setattr(journal_module, "_datasync", datasync)
    writer = SegmentWriter(tmp_path, FileNumbers(1), segment_bytes=1 << 20, page_cache_bytes=-1)
    record = entry_record(7, 0, b"x" * 300_000)
    segments = [writer.write([record], len(record))[0] for _ in range(12)]
    writer.close()
    assert segments[0] == 1 and segments[-1] >= 3                     # rolled at least twice
    for number in sorted(set(segments))[:-1]:
        path = segment_path(tmp_path, number)
        assert synced[path.stat().st_ino] == path.stat().st_size, f"segment {number} sealed with unsynced bytes"
        scan = SegmentScan(path, 0, is_last=False)
        assert list(scan.records()) and scan.valid_end == path.stat().st_size


TORN_GROUPS = {
    # the group's later page reached the disk, an earlier one did not
    "a record in the middle": lambda offsets: (offsets[4], 40),
    "the group's own mark": lambda offsets: (offsets[3] - MARK_SIZE, MARK_SIZE + 40),
}


@pytest.mark.parametrize("lost", sorted(TORN_GROUPS))
def test_a_torn_last_group_is_dropped_and_everything_before_it_replays(tmp_path, lost):
    journal = tmp_path / "journal"
    payload_with_a_mark_copy = encode_durable_mark(12345) * 3         # not at its own offset: no mark
    path, offsets = write_groups(
        journal,
        [encode_key(7, KEY), entry_record(7, 0, b"a" * 100), entry_record(7, 1, b"b" * 100)],
        [entry_record(7, 2, b"c" * 100), entry_record(7, 3, b"d" * 100),
         entry_record(7, 4, payload_with_a_mark_copy), entry_record(7, 5, b"f" * 100)],
    )
    at, length = TORN_GROUPS[lost](offsets)
    damage(path, at, length)
    recovered = recover(tmp_path, journal)
    kept = [0, 1, 2] if lost == "a record in the middle" else [0, 1]
    assert list(recovered.ledgers[7].index.entries_between(0, 10)) == kept
    assert path.stat().st_size == at
    assert any(f"torn record at offset {at}" in note for note in recovered.notes)


def test_a_torn_first_group_of_a_segment_is_dropped(tmp_path):
    journal = tmp_path / "journal"
    path, offsets = write_groups(journal, [encode_key(7, KEY), entry_record(7, 0, b"a" * 100),
                                           entry_record(7, 1, b"b" * 100)])
    damage(path, offsets[0] - MARK_SIZE, MARK_SIZE + 10)
    recovered = recover(tmp_path, journal)
    assert recovered.ledgers == {} and path.stat().st_size == offsets[0] - MARK_SIZE    # its mark and LINK


@pytest.mark.parametrize("damaged_group", [0, 1])
def test_damage_before_a_durable_mark_refuses_to_start(tmp_path, damaged_group):
    journal = tmp_path / "journal"
    path, offsets = write_groups(
        journal,
        [encode_key(7, KEY), entry_record(7, 0, b"a" * 100)],
        [entry_record(7, 1, b"b" * 100)],
        [entry_record(7, 2, b"c" * 100), entry_record(7, 3, b"d" * 100)],
    )
    at = offsets[1 + damaged_group]
    damage(path, at, 40)
    with pytest.raises(JournalCorruptError, match=f"{path} is damaged at offset {at} .*durable mark follows"):
        recover(tmp_path, journal)
    assert path.stat().st_size > at


def test_after_a_process_crash_damage_in_the_last_group_is_corruption(tmp_path):
    journal = tmp_path / "journal"
    path, offsets = write_groups(journal, [encode_key(7, KEY)],
                                 [entry_record(7, 0, b"a" * 100), entry_record(7, 1, b"b" * 100)], synced=True)
    damage(path, offsets[1], 40)                   # the mark written ahead after its fsync follows it
    with pytest.raises(JournalCorruptError, match=f"offset {offsets[1]} .*durable mark follows"):
        recover(tmp_path, journal)


def test_a_checkpoint_inside_the_last_segment_still_tells_a_torn_group_from_damage(tmp_path):
    journal = tmp_path / "journal"
    path, offsets = write_groups(
        journal, [encode_key(7, KEY), entry_record(7, 0, b"a" * 100)],
        [entry_record(7, 1, b"b" * 100)], [entry_record(7, 2, b"c" * 100), entry_record(7, 3, b"d" * 100)],
    )
    start = offsets[3] - MARK_SIZE                                    # the checkpoint: the last group's mark
    damage(path, offsets[4] + 20, 10)                                 # torn: after the last mark
    scan = SegmentScan(path, start, is_last=True)
    assert [r.offset for r in scan.records()] == [offsets[3]]
    assert scan.marked and scan.torn_at == offsets[4]


# -- a failed segment roll breaks the journal (issue 13, item 5) ---------------------------------------

class Descriptors:
    """Wraps os.open and os.close: remembers every descriptor closed twice (without closing it again,
    since the system may have handed the number to someone else) and fails opens of one path on demand."""

    def __init__(self, monkeypatch, fail_open: str = "", gate: threading.Event | None = None):
        self.closed: set[int] = set()
        self.closed_twice: list[int] = []
        real_open, real_close = os.open, os.close

        def tracked_open(path, flags, *args, **kwargs):
            if fail_open and str(path).endswith(fail_open):
                gate.wait(10)
                raise OSError(errno.EIO, "injected: no new file", str(path))
            fd = real_open(path, flags, *args, **kwargs)
            self.closed.discard(fd)
            return fd

        def tracked_close(fd):
            if fd in self.closed:
                self.closed_twice.append(fd)
                return
            real_close(fd)
            self.closed.add(fd)

        monkeypatch.setattr(os, "open", tracked_open)
        monkeypatch.setattr(os, "close", tracked_close)


def inject_directory_fsync_failure(monkeypatch, gate: threading.Event) -> None:
    """The roll's directory fsync fails once (then works again, like a transient EIO)."""
    real = journal_module.fsync_directory
    failures = [OSError(errno.EIO, "injected: directory fsync")]

    def fsync_directory(directory):
        if failures:
            gate.wait(10)
            raise failures.pop()
        real(directory)

    monkeypatch.setattr(journal_module, "fsync_directory", fsync_directory)


async def add(journal: Journal, record: bytes) -> bool:
    """Whether an add of record is acknowledged."""
    try:
        group = journal.group
    except JournalWriteError:
        return False
    journal.append(group, record)
    return await group.outcome() is None


@pytest.mark.parametrize("fault", ["directory fsync", "open"])
def test_a_failed_segment_roll_breaks_the_journal(tmp_path, monkeypatch, fault):
    gate = threading.Event()
    descriptors = Descriptors(monkeypatch, fail_open="segment-00000002.log" if fault == "open" else "", gate=gate)
    errors = []

    async def scenario():
        journal = Journal(tmp_path, FileNumbers(1), segment_bytes=4096, apply=lambda *_: None,
                          on_write_error=errors.append)
        assert await add(journal, encode_key(7, KEY) + entry_record(7, 0, b"a" * 5000))   # fills segment 1
        if fault == "directory fsync":
            inject_directory_fsync_failure(monkeypatch, gate)
        rolling = journal.group
        journal.append(rolling, entry_record(7, 1, b"b"))
        while journal.group is rolling:                        # the flusher took it and is rolling
            await asyncio.sleep(0.001)
        pending = journal.group
        journal.append(pending, entry_record(7, 2, b"c"))
        gate.set()
        assert isinstance(await rolling.outcome(), JournalWriteError)
        assert isinstance(await pending.outcome(), JournalWriteError)
        assert not await add(journal, entry_record(7, 3, b"d"))
        assert not await add(journal, entry_record(7, 4, b"e"))
        assert "segment-00000002.log failed" in journal.broken and "restart the node" in journal.broken
        await journal.close()

    asyncio.run(scenario())
    assert errors and all(isinstance(e, JournalWriteError) for e in errors)
    assert descriptors.closed_twice == []


def disk_full_once(monkeypatch, where: str) -> None:
    """The next segment roll meets a full disk (ENOSPC) once: creating the file, or syncing its first mark."""
    error = OSError(errno.ENOSPC, "No space left on device (injected)")
    if where == "open":
        real_open = os.open

        def failing_open(path, flags, *args, **kwargs):
            if str(path).endswith(".log") and flags & os.O_CREAT and error.args:
                failed = OSError(*error.args)
                error.args = ()
                raise failed
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", failing_open)
    else:
        real_sync = journal_module._datasync
        left = [error]

        def failing_sync(fd):
            if left:
                raise left.pop()
            real_sync(fd)

        monkeypatch.setattr(journal_module, "_datasync", failing_sync)


@pytest.mark.parametrize("where", ["open", "first mark"])
def test_a_full_disk_at_a_segment_roll_fails_the_group_and_the_next_one_rolls_again(tmp_path, monkeypatch, where):
    """A full disk while the next segment starts (before its directory entry is synced) does not break the
    journal: the group fails with the ENOSPC as its cause (storage.py turns the node read-only for it), the
    half-made segment file is gone, and the next group rolls again to the same number (a gap would read as
    segments removed by compaction at a restart without a checkpoint); replay finds every acknowledged record."""
    errors = []

    async def scenario():
        numbers = FileNumbers(1)
        journal = Journal(tmp_path, numbers, segment_bytes=4096, apply=lambda *_: None, on_write_error=errors.append)
        assert await add(journal, encode_key(7, KEY) + entry_record(7, 0, b"a" * 5000))   # fills segment 1
        disk_full_once(monkeypatch, where)
        assert not await add(journal, entry_record(7, 1, b"lost"))
        assert journal.broken is None
        assert not segment_path(tmp_path, 2).exists()
        assert numbers.take() == 3                              # a compaction takes the next number meanwhile
        assert await add(journal, entry_record(7, 1, b"b"))
        assert await add(journal, entry_record(7, 2, b"c"))
        await journal.close()

    asyncio.run(scenario())
    assert len(errors) == 1 and errors[0].__cause__.errno == errno.ENOSPC
    assert sorted(p.name for p in tmp_path.glob("*.log")) == ["segment-00000001.log", "segment-00000002.log"]
    recovered = recover(tmp_path.parent, tmp_path)
    assert list(recovered.ledgers[7].index.entries_between(0, 10)) == [0, 1, 2]


def test_a_failed_apply_breaks_the_journal_and_fails_the_group_gathering_behind_it(tmp_path):
    """Review finding: when applying a durable group raised (a bug), the journal broke but the node was not
    told (it said so only at its next disk check) and the group gathering behind it was still written and
    answered OK, after the break."""
    errors = []
    gate = threading.Event()

    def apply(segment, base, group, fsync_seconds):
        if group.records == 1 and not gate.is_set():
            gate.set()
            raise RuntimeError("a bug in apply")

    async def scenario():
        journal = Journal(tmp_path, FileNumbers(1), segment_bytes=1 << 20, apply=apply, on_write_error=errors.append)
        first = journal.group
        journal.append(first, entry_record(7, 0, b"a"))
        while journal.group is first:   # the flusher took it and waits for its fsync: the next one gathers
            await asyncio.sleep(0)       # (one turn of the loop, far shorter than an fsync)
        behind = journal.group
        journal.append(behind, entry_record(7, 1, b"b"))
        journal.append(behind, entry_record(7, 2, b"c"))
        assert isinstance(await first.outcome(), JournalWriteError)
        assert isinstance(await behind.outcome(), JournalWriteError)
        assert "applying a journal group failed" in journal.broken
        assert not await add(journal, entry_record(7, 3, b"d"))
        await journal.close()

    asyncio.run(scenario())
    assert errors and all(isinstance(e, JournalWriteError) for e in errors)


@pytest.mark.parametrize("where", ["open", "first mark"])
def test_a_node_restarted_on_a_full_disk_starts_read_only_and_serves_reads(tmp_path, monkeypatch, where):
    """Helper audit 2026-11-29: every start opens a new journal segment, and a full disk there made Storage.open raise,
    so a node restarted while its disk was full did not start at all, instead of serving reads read-only (rule 9).
    It starts read-only now; once space is back, the first add rolls the segment and replay finds everything."""
    from storage_node.config import NodeConfig
    from storage_node.storage import Storage
    from tests.harness.node_client import make_entry, payload_for

    config = NodeConfig(data_dir=tmp_path, port=0, metadata="zk://127.0.0.1:1/unused", node_id="unit",
                        journal_segment_bytes=1 << 20)

    async def add(storage, entry_id):
        results, group = storage.add_batch([make_entry(1, entry_id, payload_for(1, entry_id))])
        if group is not None:
            await group.done
        return results[0].status

    async def scenario():
        storage = Storage(config)
        await storage.open()
        assert await add(storage, 0) == pb.OK
        await storage.close()
        disk_full_once(monkeypatch, where)
        storage = Storage(config)
        await storage.open()                                   # raised JournalWriteError before
        assert storage.ready and storage.is_read_only_because("enospc")
        assert storage.read_entry(1, 0)[3] == payload_for(1, 0)
        assert await add(storage, 1) == pb.READ_ONLY
        storage.set_read_only("enospc", "")                    # the node's disk watch, once space is back
        assert await add(storage, 1) == pb.OK
        await storage.close()

    asyncio.run(scenario())
    recovered = recover(tmp_path, tmp_path / "journal")
    assert list(recovered.ledgers[1].index.entries_between(0, 10)) == [0, 1]
