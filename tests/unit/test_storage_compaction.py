"""Compaction without processes: planning (live fraction, which files), and whole rounds on a real Storage
in a temporary directory, including the files a crash would leave at each step of a round."""
from __future__ import annotations

import asyncio
import errno
import os
import shutil

import pytest

from protos import ledger_pb2 as pb
from storage_node.checkpoint import SNAPSHOT_NAME
from storage_node.compaction import (
    MERGE_SMALL_FILES,
    copy_records,
    moves_out_of,
    plan_compaction,
)
from storage_node.config import NodeConfig
from storage_node.entry_index import LedgerIndex, pack, unpack
from storage_node.errors import JournalCorruptError, UncopyableRecordError
from storage_node.ledger_state import LedgerState
from storage_node.replay import recover
from storage_node.segments import data_file_path, list_compacted, list_segments, read_record, segment_path
from storage_node.storage import Storage
from tests.harness.node_client import KEY, make_entry, payload_for

MiB = 1 << 20


def test_plan_drops_dead_files_rewrites_sparse_ones_and_keeps_dense_ones():
    sizes = {1: 1000, 2: 1000, 3: 1000, 6: 500}
    live = {2: 300, 3: 800, 6: 500, 9: 42}            # 1 is dead; 9 is not a candidate (the open segment)
    plan = plan_compaction(sizes, live, threshold=0.5)
    assert plan.drop == (1,) and plan.rewrite == (2,)
    assert plan.live_bytes == 300 and plan.reclaim_bytes == 1700
    assert plan.sources == (2, 1)
    assert not plan_compaction({3: 1000}, {3: 800}, threshold=0.5)
    assert plan_compaction({3: 1000}, {3: 800}, threshold=0.9).rewrite == (3,)
    assert plan_compaction({3: 1000}, {3: 800}, threshold=0.0).rewrite == ()


def test_plan_merges_small_files_once_there_are_enough_of_them():
    small = {number: 100 for number in range(1, MERGE_SMALL_FILES)}             # one short of a merge, all live
    sizes, live = {**small, 50: 4000, 51: 1000}, {**small, 50: 4000, 51: 100}   # 50 big and live, 51 sparse
    assert plan_compaction(sizes, live, threshold=0.5, small_bytes=1000, merge_bytes=4000).rewrite == (51,)
    sizes[60] = live[60] = 999                                                  # one more small file
    plan = plan_compaction(sizes, live, threshold=0.5, small_bytes=1000, merge_bytes=4000)
    assert plan.rewrite == (*small, 51, 60) and plan.drop == ()
    assert plan.live_bytes == sum(small.values()) + 100 + 999 and plan.reclaim_bytes == 900
    assert plan_compaction(sizes, live, threshold=0.5, small_bytes=999, merge_bytes=4000).rewrite == (51,)
    assert plan_compaction(sizes, live, threshold=0.0, small_bytes=1000, merge_bytes=4000).rewrite == ()
    # At most merge_bytes a round, the smallest first: 999 does not fit beside the fifteen of 100.
    assert plan_compaction(sizes, live, threshold=0.5, small_bytes=1000, merge_bytes=1600).rewrite == (*small, 51)
    # A file a damaged record stopped a copy of is never rewritten, merged or sparse; it is dropped once dead.
    sizes[61] = live[61] = 100
    plan = plan_compaction(sizes, live, threshold=0.5, small_bytes=1000, merge_bytes=4000,
                           uncopyable=frozenset({1, 51}))
    assert plan.rewrite == (*range(2, MERGE_SMALL_FILES), 60, 61)
    live[1] = 0
    assert plan_compaction(sizes, live, threshold=0.5, uncopyable=frozenset({1})).drop == (1,)


def test_rounds_that_each_copy_a_little_do_not_pile_up_compacted_files(tmp_path):
    """A ledger kept for good beside ledgers that are deleted: every round rewrites the sealed segments and
    copies the kept ledger's records into a compacted file of its own, which stays fully live. Before small
    files were merged, each round left one more (24 of them here; a node running for months, tens of
    thousands)."""
    rounds, kept, size = MERGE_SMALL_FILES + 8, 1, 8000

    async def scenario():
        storage = Storage(_config(tmp_path))
        await storage.open()
        written = 0
        for round_number in range(rounds):
            written = await _small_files(storage, kept, 1, size, written)
            files = list_compacted(storage.journal_dir) + list_segments(storage.journal_dir)
            assert len(files) <= MERGE_SMALL_FILES + 3, f"round {round_number}: {len(files)} files"
        _assert_reads(storage, [kept], written, size)
        storage = await _restart(storage, tmp_path)
        _assert_reads(storage, [kept], written, size)
        await storage.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("fault", ["damaged", "unreadable"])
def test_a_damaged_record_in_a_small_file_stops_one_round_not_every_later_one(tmp_path, monkeypatch, fault):
    """A fully live small file was never copied before small files were merged; a damaged record in it (or one
    the disk cannot read back: EIO) now fails the copy of a merge. That round still deletes the files without live
    bytes, on a full disk too, and the file is left out of every later round (reads of its entry answer ERROR), so
    the other small files still merge."""
    kept, size = 1, 8000

    async def scenario():
        storage = Storage(_config(tmp_path))
        await storage.open()
        written = await _small_files(storage, kept, MERGE_SMALL_FILES - 1, size)
        damaged_entry = 0
        location, length = storage.ledgers[kept].index.get(damaged_entry)
        damaged_file, offset = unpack(location)
        if fault == "damaged":
            with open(data_file_path(storage.journal_dir, damaged_file), "r+b") as f:
                f.seek(offset + length - 1)
                last = f.read(1)
                f.seek(offset + length - 1)
                f.write(bytes([last[0] ^ 0xFF]))
        else:
            damaged_path = data_file_path(storage.journal_dir, damaged_file)

            def read_back(fd, at, size):     # the disk fails this file's reads (a bad sector)
                if os.path.samefile(f"/proc/self/fd/{fd}", damaged_path):
                    raise OSError(errno.EIO, "Input/output error")
                return read_record(fd, at, size)

            monkeypatch.setattr("storage_node.compaction.read_record", read_back)
        await _write(storage, range(90, 91), entries=140, size=size)    # a ledger of whole segments of its own
        storage = await _restart(storage, tmp_path)                      # seals them
        dead = [n for n in list_segments(storage.journal_dir)[:-1]
                if not storage.ledgers[kept].index.bytes_by_file.get(n)]
        assert dead and await storage.delete_ledgers([90]) == 1
        written = await _small_files(storage, kept, 1, size, written)    # the sixteenth small file
        await storage.checkpoint()

        def full_disk(*_):
            raise OSError(errno.ENOSPC, "No space left on device")

        with monkeypatch.context() as disk:      # no checkpoint can be written: the dead files are still deleted
            disk.setattr("storage_node.storage.save_snapshot", full_disk)
            disk.setattr("storage_node.storage.save_delta", full_disk)
            with pytest.raises(UncopyableRecordError) as failed:
                await storage.compact(0.5)
        assert failed.value.file_number == damaged_file
        assert not [n for n in dead if segment_path(storage.journal_dir, n).exists()]
        written = await _small_files(storage, kept, 3, size, written)   # none raises: the others merge
        files = list_compacted(storage.journal_dir)
        assert damaged_file in files and len(files) < MERGE_SMALL_FILES     # they merged
        if fault == "damaged":
            assert storage.read_entry(kept, damaged_entry)[0] == pb.ERROR
        for entry_id in range(1, written):
            assert storage.read_entry(kept, entry_id)[3] == payload_for(kept, entry_id, size)
        await storage.close()

    asyncio.run(scenario())


async def _small_files(storage: Storage, kept: int, rounds: int, size: int, written: int = 0) -> int:
    """Rounds that each leave one small compacted file of the kept ledger's records (its neighbours in the
    segments are deleted); the kept ledger's entries written in all."""
    for round_number in range(rounds):
        dropped = 1000 + written
        for _ in range(10):     # ~1.3 MiB: the journal rolls past a 1 MiB segment
            batch = [make_entry(kept, written, payload_for(kept, written, size))]
            batch += [make_entry(dropped, written * 16 + i, payload_for(dropped, i, size)) for i in range(15)]
            results, group = storage.add_batch(batch)
            assert all(r[2] == pb.OK for r in results) and await group.done is None
            written += 1
        assert await storage.delete_ledgers([dropped]) == 1
        await storage.compact(0.5)
    return written


def test_live_bytes_and_moves_count_dense_and_overflow_slots_once():
    state = LedgerState(7, KEY)
    state.index.put(0, pack(1, 0), 100)
    state.index.put(2, pack(2, 0), 50)
    state.index.put(1 << 40, pack(1, 100), 70)       # far away: overflow
    assert state.index.bytes_by_file == {1: 170, 2: 50}
    moves = moves_out_of([state], {1})
    assert [(m.entry_id, unpack(m.location), m.length) for m in moves] == [(0, (1, 0), 100), (1 << 40, (1, 100), 70)]


def _config(tmp_path) -> NodeConfig:
    return NodeConfig(data_dir=tmp_path, port=0, metadata="zk://127.0.0.1:1/unused", node_id="unit",
                      journal_segment_bytes=MiB)


async def _write(storage: Storage, ledgers: range, entries: int, size: int) -> None:
    for entry_id in range(entries):
        batch = [make_entry(l, entry_id, payload_for(l, entry_id, size)) for l in ledgers]
        results, group = storage.add_batch(batch)
        assert all(r[2] == pb.OK for r in results), results
        assert await group.done is None


def _assert_reads(storage: Storage, ledgers, entries: int, size: int) -> None:
    for l in ledgers:
        for entry_id in range(entries):
            status, message, _, payload, _ = storage.read_entry(l, entry_id)
            assert status == pb.OK, message
            assert payload == payload_for(l, entry_id, size)


async def _restart(storage: Storage, tmp_path) -> Storage:
    await storage.close()
    again = Storage(_config(tmp_path))
    await again.open()
    return again


def test_a_round_keeps_live_ledgers_and_replay_after_it_restores_exactly_them(tmp_path):
    async def scenario():
        storage = Storage(_config(tmp_path))
        await storage.open()
        await _write(storage, range(1, 7), entries=60, size=8000)       # ~2.9 MB over several 1 MiB segments
        storage = await _restart(storage, tmp_path)                      # seals the last segment
        sealed = list_segments(storage.journal_dir)[:-1]
        assert len(sealed) >= 3
        before = storage.files.measure().journal_bytes
        assert await storage.delete_ledgers([2, 4, 6]) == 3
        result = await storage.compact(0.8)
        assert set(result.deleted) >= set(sealed) and result.rewritten
        assert storage.files.measure().journal_bytes < 0.6 * before
        _assert_reads(storage, [1, 3, 5], 60, 8000)
        assert storage.read_entry(2, 0)[0] == pb.NO_LEDGER
        storage = await _restart(storage, tmp_path)
        assert sorted(storage.ledgers) == [1, 3, 5]
        _assert_reads(storage, [1, 3, 5], 60, 8000)
        await storage.close()

    asyncio.run(scenario())


def test_files_left_by_a_crash_in_the_middle_of_a_round_are_harmless_and_cleaned_up(tmp_path):
    async def scenario():
        storage = Storage(_config(tmp_path))
        await storage.open()
        await _write(storage, range(1, 5), entries=60, size=8000)
        storage = await _restart(storage, tmp_path)
        first = list_segments(storage.journal_dir)[0]
        kept = tmp_path / "kept-segment"
        shutil.copyfile(segment_path(storage.journal_dir, first), kept)
        await storage.delete_ledgers([1, 2])
        await storage.compact(0.8)
        await storage.close()

        # Crash after the checkpoint but before the sources were deleted: a source is still there.
        shutil.copyfile(kept, segment_path(storage.journal_dir, first))
        # Crash before a later round's checkpoint: an orphan compacted file nobody points to.
        orphan_number = max(list_segments(storage.journal_dir) + list_compacted(storage.journal_dir)) + 1
        live = recover(tmp_path, storage.journal_dir).ledgers[3].index
        copy_records(storage.journal_dir, orphan_number, [live.get(e) for e in range(10)])
        recovered = recover(tmp_path, storage.journal_dir)
        assert sorted(recovered.ledgers) == [3, 4]
        assert recovered.next_segment > orphan_number

        storage = Storage(_config(tmp_path))
        await storage.open()
        _assert_reads(storage, [3, 4], 60, 8000)
        result = await storage.compact(0.8)
        assert first in result.deleted and orphan_number in result.deleted
        _assert_reads(storage, [3, 4], 60, 8000)
        storage = await _restart(storage, tmp_path)
        _assert_reads(storage, [3, 4], 60, 8000)
        await storage.close()

    asyncio.run(scenario())


def test_a_late_add_after_the_delete_replays_as_a_new_ledger(tmp_path):
    async def scenario():
        storage = Storage(_config(tmp_path))
        await storage.open()
        await _write(storage, range(1, 3), entries=5, size=100)
        await storage.delete_ledgers([1])
        results, group = storage.add_batch([make_entry(1, 7, b"late", lac=-1)])
        assert results[0][2] == pb.OK and await group.done is None
        storage = await _restart(storage, tmp_path)
        assert list(storage.ledgers[1].index.entries_between(0, 100)) == [7]
        _assert_reads(storage, [2], 5, 100)
        await storage.close()

    asyncio.run(scenario())


def test_without_its_snapshot_a_compacted_journal_refuses_to_replay(tmp_path):
    async def scenario():
        storage = Storage(_config(tmp_path))
        await storage.open()
        await _write(storage, range(1, 3), entries=200, size=8000)
        storage = await _restart(storage, tmp_path)
        await storage.delete_ledgers([1])
        assert (await storage.compact(0.8)).deleted
        await storage.close()

    asyncio.run(scenario())
    (tmp_path / SNAPSHOT_NAME).unlink()
    with pytest.raises(JournalCorruptError, match="snapshot .* is missing"):
        recover(tmp_path, tmp_path / "journal")


def test_a_periodic_checkpoint_rewrites_the_snapshot_only_when_what_it_holds_changed(tmp_path):
    async def scenario():
        storage = Storage(_config(tmp_path))
        await storage.open()
        snapshot = tmp_path / SNAPSHOT_NAME
        await _write(storage, range(1, 3), entries=5, size=100)
        assert await storage.checkpoint(only_if_changed=True)
        written = snapshot.stat().st_ino                         # each snapshot is a new file renamed into place
        assert not await storage.checkpoint(only_if_changed=True)   # an idle node: the same state, not rewritten
        assert snapshot.stat().st_ino == written
        await _write(storage, range(1, 2), entries=6, size=100)     # entry 5 of ledger 1 (0-4 are there)
        assert await storage.checkpoint(only_if_changed=True)
        assert await storage.delete_ledgers([2]) == 1
        assert await storage.checkpoint(only_if_changed=True)
        assert not await storage.checkpoint(only_if_changed=True)
        assert await storage.checkpoint()                           # unconditional (shutdown, compaction)
        await storage.close()

    asyncio.run(scenario())


def test_moves_whose_compaction_checkpoint_failed_are_in_the_next_periodic_one(tmp_path, monkeypatch):
    async def scenario():
        storage = Storage(_config(tmp_path))
        await storage.open()
        await _write(storage, range(1, 7), entries=60, size=8000)
        storage = await _restart(storage, tmp_path)
        assert await storage.delete_ledgers([2, 4, 6]) == 3
        assert await storage.checkpoint(only_if_changed=True)      # covers the journal up to the deletes

        def full_disk(*_):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr("storage_node.storage.save_snapshot", full_disk)   # a whole one, or a delta
        monkeypatch.setattr("storage_node.storage.save_delta", full_disk)
        with pytest.raises(OSError):
            await storage.compact(0.8)                              # moved entries, then failed to checkpoint
        monkeypatch.undo()
        # The journal did not move since the last snapshot, but the index did: not skipped.
        assert await storage.checkpoint(only_if_changed=True)
        assert (await storage.compact(0.8)).deleted
        storage = await _restart(storage, tmp_path)
        _assert_reads(storage, [1, 3, 5], 60, 8000)
        await storage.close()

    asyncio.run(scenario())


def test_a_lac_a_read_only_node_took_in_memory_is_in_the_next_periodic_checkpoint(tmp_path):
    async def scenario():
        storage = Storage(_config(tmp_path))
        await storage.open()
        await _write(storage, range(1, 2), entries=5, size=100)      # the entries carry LACs up to 3
        assert await storage.checkpoint(only_if_changed=True)
        storage.set_read_only("operator", "drained")
        assert await storage.write_lac(1, KEY, 4) is None            # not journaled: the node is read-only
        assert storage.ledgers[1].last_add_confirmed == 4
        assert await storage.checkpoint(only_if_changed=True)       # the journal did not move, the LAC did
        again = Storage(_config(tmp_path))                          # as after a crash: no checkpoint at close
        await again.open()
        assert again.ledgers[1].last_add_confirmed == 4
        await again.close()

    asyncio.run(scenario())


def test_a_drop_whose_delete_record_failed_is_checkpointed_before_compaction_deletes_its_files(tmp_path, monkeypatch):
    """Helper audit 2026-11-29: garbage collection took a ledger out of memory, its DELETE record then failed (a full
    disk), and compaction's checkpoint, written only when something changed, saw nothing new: it kept the old
    snapshot and deleted the ledger's file, now without live entries. After a crash the snapshot brought the
    ledger back, pointing into the deleted file (reads answered ERROR until the next round dropped it again)."""
    from storage_node import journal as journal_module
    from storage_node.errors import JournalWriteError

    config = NodeConfig(data_dir=tmp_path, port=0, metadata="zk://127.0.0.1:1/unused", node_id="unit",
                        journal_segment_bytes=1 << 20)

    async def scenario():
        storage = Storage(config)
        await storage.open()
        for ledger_id in (1, 2):   # each ledger in a segment of its own (a restart rolls the segment)
            for entry_id in range(60):
                _, group = storage.add_batch([make_entry(ledger_id, entry_id, payload_for(ledger_id, entry_id, 8000))])
                assert await group.done is None
            await storage.close()
            storage = Storage(config)
            await storage.open()
        await storage.checkpoint(only_if_changed=True)
        real_write = journal_module.SegmentWriter.write

        def full_once(self, buffers, total):
            monkeypatch.setattr(journal_module.SegmentWriter, "write", real_write)
            raise JournalWriteError("journal write failed: disk full (injected)") from OSError(errno.ENOSPC, "full")

        monkeypatch.setattr(journal_module.SegmentWriter, "write", full_once)
        assert await storage.delete_ledgers([1]) == 0 and 1 not in storage.ledgers
        assert (await storage.compact(0.8)).deleted   # ledger 1's segment, without live entries now
        # a crash: no close
        restarted = Storage(config)
        await restarted.open()
        assert restarted.read_entry(1, 0)[0] == pb.NO_LEDGER and 1 not in restarted.ledgers
        assert restarted.read_entry(2, 59)[3] == payload_for(2, 59, 8000)

    asyncio.run(scenario())


class _CountedLedgers(dict):
    """storage.ledgers, counting the ledger states a pass over it yields (while `counting`)."""

    def __init__(self, ledgers):
        super().__init__(ledgers)
        self.yielded = 0
        self.counting = True

    def _counted(self, states):
        for state in states:
            self.yielded += self.counting
            yield state

    def values(self):
        return self._counted(super().values())

    def items(self):
        return self._counted(super().items())

    def __iter__(self):
        return self._counted(super().__iter__())


def test_a_rounds_planning_looks_only_at_the_ledgers_in_the_files_it_rewrites(tmp_path, monkeypatch):
    """Three ledgers fill some segments, two are deleted, so a round rewrites those segments and moves the third's
    records; 10 or 2,000 other ledgers have an entry each in a segment the round keeps. The round looks at the same
    ledgers either way: none by a pass over every ledger the node holds (its checkpoint aside, which costs what
    changed), one searched for records to move."""
    async def ledgers_looked_at(others: int, data_dir) -> tuple[int, int]:
        storage = Storage(_config(data_dir))
        await storage.open()
        await _write(storage, range(1, 4), entries=60, size=8000)         # ~1.4 MB: segments of these three only
        storage = await _restart(storage, data_dir)                       # seals them
        await _write(storage, range(10, 10 + others), entries=1, size=100)
        storage = await _restart(storage, data_dir)
        assert await storage.delete_ledgers([2, 3]) == 2
        storage.ledgers = ledgers = _CountedLedgers(storage.ledgers)
        searched = []
        records_in = LedgerIndex.records_in
        monkeypatch.setattr(LedgerIndex, "records_in", lambda index, numbers: searched.append(index)
                            or records_in(index, numbers))
        checkpoint = storage._checkpoint      # what compaction calls, under the checkpoint lock

        async def uncounted_checkpoint(*args, **kwargs):
            ledgers.counting = False
            try:
                return await checkpoint(*args, **kwargs)
            finally:
                ledgers.counting = True

        storage._checkpoint = uncounted_checkpoint
        result = await storage.compact(0.5)                # a third live: rewritten; the others' file is kept
        monkeypatch.undo()
        assert result.rewritten and result.copied_bytes
        _assert_reads(storage, [1], 60, 8000)
        await storage.close()
        return ledgers.yielded, len(searched)

    async def scenario():
        few, many = await ledgers_looked_at(10, tmp_path / "few"), await ledgers_looked_at(2000, tmp_path / "many")
        assert few == many, (f"(ledgers passed over, ledgers searched for moves): {few} with 10 other ledgers, "
                             f"{many} with 2,000")

    asyncio.run(scenario())
