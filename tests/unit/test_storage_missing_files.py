"""A data directory missing files the node wrote (storage_node/replay.py): the newest checkpoint deleted or replaced by
an older copy, a journal segment after the checkpoint deleted or cut short at a record boundary. Each one made the
node start and answer NO_LEDGER for what it had acknowledged, or ERROR and then let compaction delete the only copy
(storage audit 2026-11-29); it refuses to start now, by the journal's CHECKPOINT and LINK records. And what those
records must not do: stop a healthy node, or make an idle one write a checkpoint every interval."""
from __future__ import annotations

import asyncio
import errno
import os
import random

import pytest

from protos import ledger_pb2 as pb
from storage_node import journal as journal_module
from storage_node.checkpoint import SNAPSHOT_NAME, delta_name, load_checkpoints
from storage_node.config import NodeConfig
from storage_node.errors import JournalCorruptError, JournalWriteError
from storage_node.records import CheckpointRecord, LinkRecord, decode
from storage_node.replay import recover
from storage_node.segments import SegmentScan, list_compacted, list_segments, segment_path
from storage_node.storage import Storage
from tests.harness.node_client import KEY, make_entry, payload_for

MiB = 1 << 20
REFUSED = "the node refuses to start. Restore the data directory, or decommission this node"


def _config(path) -> NodeConfig:
    return NodeConfig(data_dir=path, port=0, metadata="zk://127.0.0.1:1/unused", node_id="unit",
                      journal_segment_bytes=MiB)


async def _open(path) -> Storage:
    storage = Storage(_config(path))
    await storage.open()
    return storage


async def _add(storage: Storage, ledger_id: int, entry_ids, size: int) -> None:
    results, group = storage.add_batch([make_entry(ledger_id, e, payload_for(ledger_id, e, size)) for e in entry_ids])
    assert all(r.status == pb.OK for r in results), results
    assert await group.done is None


async def _fill_segment(storage: Storage, ledger_id: int, first: int) -> int:
    """Entries of ledger_id from first on until the current segment is full (the next write rolls); the next id."""
    while storage.journal.durable.offset < MiB:
        await _add(storage, ledger_id, [first], 8000)
        first += 1
    return first


async def _crash(storage: Storage) -> None:
    """The process dies: what the journal holds stays, no checkpoint at close."""
    await storage.journal.close()


def _journal_records(path, kind) -> list:
    """The records of one kind in every journal segment of the data directory at path."""
    found = []
    for number in list_segments(path / "journal"):
        scan = SegmentScan(segment_path(path / "journal", number), 0, is_last=False)
        found += [record for r in scan.records() if isinstance(record := decode(r.body), kind)]
    return found


def _newest_delta(path):
    chain = load_checkpoints(path)[2]
    return path / delta_name(chain.generation, chain.deltas)


# -- the newest checkpoint lost ---------------------------------------------------------------------------------

async def _compaction_after_the_older_checkpoint(path) -> None:
    """Scenario A: a base, delta 1 in segment 2; ledger 7 and a fence of ledger 8 in segment 3, filled by ledger 3;
    ledger 3 deleted and compacted: ledger 7 moves into a compacted file, delta 2 is written in segment 4 and segment
    3 deleted, so only delta 2 knows ledgers 7 and 8. Then a crash."""
    storage = await _open(path)
    await _add(storage, 100, range(4000), 10)             # a large base: the checkpoints after it are deltas
    assert await storage.checkpoint()
    await _fill_segment(storage, 1, 0)
    await _add(storage, 2, [0], 8000)                     # rolls to segment 2
    assert await storage.checkpoint()                     # delta 1
    await _fill_segment(storage, 2, 1)
    await _add(storage, 7, range(5), 100)                 # rolls to segment 3
    assert await storage.fence(8, KEY) is None
    await _fill_segment(storage, 3, 0)
    await _add(storage, 2, [10_000], 100)                 # rolls to segment 4
    assert storage.journal.durable.segment == 4
    assert await storage.delete_ledgers([3]) == 1
    result = await storage.compact(0.5)
    assert result.deleted == (3,) and list_compacted(path / "journal")
    assert load_checkpoints(path)[2].deltas == 2
    await _crash(storage)


@pytest.mark.parametrize("lost", [None, "the newest delta"])
def test_the_newest_delta_lost_after_compaction_removed_a_segment_refuses_to_start(tmp_path, lost):
    """It started and answered NO_LEDGER for ledger 7, and ledger 8 was no longer fenced (rules 6 and 8)."""
    asyncio.run(_compaction_after_the_older_checkpoint(tmp_path))
    if lost:
        _newest_delta(tmp_path).unlink()

    async def restart():
        storage = await _open(tmp_path)
        assert storage.read_entry(7, 0).status == pb.OK and storage.ledgers[8].fenced
        await storage.close()

    if not lost:
        asyncio.run(restart())
        return
    with pytest.raises(JournalCorruptError, match=REFUSED):
        asyncio.run(restart())


async def _compaction_below_the_older_checkpoint(path, new_base: bool) -> bytes:
    """Scenario B: ledger 1 in segment 1, ledger 2 filling segments 1 and 2, a base in segment 3 (its file is
    returned), then a delta (or, new_base, a restart: the next checkpoint is the base of a new generation); ledger 2
    deleted and compacted: ledger 1 moves into a compacted file and segments 1 and 2 go, all below the older
    checkpoints' position, so only the compaction's checkpoint knows where ledger 1 is now. Then a crash."""
    storage = await _open(path)
    await _add(storage, 100, range(4000), 10)
    await _add(storage, 1, range(5), 100)
    entry_id = await _fill_segment(storage, 2, 0)
    await _add(storage, 2, [entry_id], 8000)
    await _fill_segment(storage, 2, entry_id + 1)
    await _add(storage, 4, range(20), 100)                # rolls to segment 3
    assert await storage.checkpoint()
    base = (path / SNAPSHOT_NAME).read_bytes()
    if new_base:
        await storage.close()
        storage = await _open(path)
    await _add(storage, 4, [20], 100)
    assert await storage.checkpoint()
    assert await storage.delete_ledgers([2]) == 1
    result = await storage.compact(0.5)
    assert set(result.deleted) == {1, 2} and list_segments(path / "journal")[0] == 3
    await _crash(storage)
    return base


LOST_CHECKPOINTS = {
    "the newest delta": (False, "records checkpoint snapshot-delta-1-2 .* newer than the one loaded "
                                "\\(snapshot-delta-1-1\\)"),
    "an older snapshot restored": (True, "records checkpoint snapshot of generation 2 .* newer than the one loaded "
                                         "\\(snapshot of generation 1\\)"),
}


@pytest.mark.parametrize("lost", sorted(LOST_CHECKPOINTS))
def test_the_newest_checkpoint_lost_after_compaction_moved_entries_below_it_refuses_to_start(tmp_path, lost):
    """It started and answered ERROR for ledger 1 (the older checkpoint points into the deleted segment 1), and the
    next compaction round deleted the compacted file nobody pointed to any more: the only copy."""
    new_base, message = LOST_CHECKPOINTS[lost]
    base = asyncio.run(_compaction_below_the_older_checkpoint(tmp_path, new_base))
    compacted = list_compacted(tmp_path / "journal")
    if new_base:
        (tmp_path / SNAPSHOT_NAME).write_bytes(base)
    else:
        _newest_delta(tmp_path).unlink()
    with pytest.raises(JournalCorruptError, match=message):
        asyncio.run(_open(tmp_path))
    assert list_compacted(tmp_path / "journal") == compacted


@pytest.mark.parametrize("new_base", [False, True])
def test_after_compaction_below_the_older_checkpoint_a_complete_directory_starts(tmp_path, new_base):
    asyncio.run(_compaction_below_the_older_checkpoint(tmp_path, new_base))

    async def restart_and_compact():
        storage = await _open(tmp_path)
        for _ in range(2):
            assert [storage.read_entry(1, e).payload for e in range(5)] == [payload_for(1, e, 100) for e in range(5)]
            await storage.compact(0.5)
        await storage.close()

    asyncio.run(restart_and_compact())


def test_after_the_snapshot_was_damaged_the_next_base_takes_a_generation_above_every_one_the_journal_records(tmp_path):
    """With the base of generation 2 damaged and no delta of it, no file says generation 2 was ever used."""
    async def run():
        storage = await _open(tmp_path)
        await _add(storage, 1, range(3), 100)
        assert await storage.checkpoint()                 # the base of generation 1
        await storage.close()
        storage = await _open(tmp_path)
        await _add(storage, 1, [3], 100)
        assert await storage.checkpoint()                 # the base of generation 2, recorded in the journal
        await _crash(storage)

    asyncio.run(run())
    snapshot = tmp_path / SNAPSHOT_NAME
    blob = snapshot.read_bytes()
    snapshot.write_bytes(blob[:-1] + bytes([blob[-1] ^ 0xFF]))
    recovered = recover(tmp_path, tmp_path / "journal")
    assert any("damaged checkpoint snapshot" in note for note in recovered.notes)
    assert recovered.newest_generation == 2


# -- a journal segment after the checkpoint lost -----------------------------------------------------------------

@pytest.mark.parametrize("damage", ["deleted", "cut at a record boundary"])
def test_a_segment_after_the_checkpoint_deleted_or_cut_short_refuses_to_start(tmp_path, damage):
    """It started and answered NO_LEDGER for the ledgers only that segment held (rule 8)."""
    async def write() -> int:
        storage = await _open(tmp_path)
        await _add(storage, 1, [0], 100)
        assert await storage.checkpoint()                 # in segment 1
        entry_id = await _fill_segment(storage, 1, 1)
        await _add(storage, 7, range(5), 100)             # rolls to segment 2
        cut = storage.journal.durable.offset
        await _add(storage, 9, range(3), 100)
        await _fill_segment(storage, 1, entry_id)
        await _add(storage, 1, [10_000], 100)             # rolls to segment 3
        assert storage.journal.durable.segment == 3
        await _crash(storage)
        return cut

    cut = asyncio.run(write())
    middle = segment_path(tmp_path / "journal", 2)
    if damage == "deleted":
        middle.unlink()
        found = "segment 1, whose valid records end at offset"
    else:
        os.truncate(middle, cut)
        found = f"segment 2, whose valid records end at offset {cut}"
    with pytest.raises(JournalCorruptError, match=f"segment-00000003.log was started after segment 2 ended at "
                                                  f"offset .* but the segment replayed before it is {found}"):
        asyncio.run(_open(tmp_path))


def test_each_segment_links_to_the_one_before_across_restarts_and_a_roll_a_full_disk_stopped(tmp_path, monkeypatch):
    """The first segment after a start names the last one as replay left it; a roll stopped by a full disk takes the
    same number again, later, and still names the segment sealed before it."""
    async def scenario():
        storage = await _open(tmp_path)                   # segment 1
        await _add(storage, 1, range(3), 100)
        await storage.close()
        storage = await _open(tmp_path)                   # segment 2
        entry_id = await _fill_segment(storage, 1, 3)
        real_sync = journal_module._datasync

        def full_disk_once(fd):                           # syncing the first mark and LINK of segment 3
            monkeypatch.setattr(journal_module, "_datasync", real_sync)
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

        monkeypatch.setattr(journal_module, "_datasync", full_disk_once)
        _, group = storage.add_batch([make_entry(1, entry_id, payload_for(1, entry_id, 100))])
        assert isinstance(await group.done, JournalWriteError)
        assert not segment_path(tmp_path / "journal", 3).exists()
        assert storage._numbers.take() == 4               # compaction takes the next number meanwhile
        storage.set_read_only("enospc", "")
        await _add(storage, 1, [entry_id], 100)           # segment 3 at last
        await _crash(storage)

    asyncio.run(scenario())
    journal = tmp_path / "journal"
    ends = {n: segment_path(journal, n).stat().st_size for n in list_segments(journal)}
    assert list(ends) == [1, 2, 3]
    assert _journal_records(tmp_path, LinkRecord) == [LinkRecord(0, 0), LinkRecord(1, ends[1]),
                                                      LinkRecord(2, ends[2])]


# -- what the records must not do ---------------------------------------------------------------------------------

def test_a_healthy_node_with_checkpoints_compaction_rolls_gc_and_restarts_always_starts(tmp_path):
    rng = random.Random(7)
    live: dict[int, int] = {}            # ledger -> entries written (0: fenced, never written)
    next_ledger = 1
    deleted: list[int] = []              # files compaction deleted

    async def run():
        nonlocal next_ledger
        storage = await _open(tmp_path)
        for round_ in range(12):
            for _ in range(rng.randint(1, 3)):
                live[next_ledger] = rng.randint(20, 90)
                await _add(storage, next_ledger, range(live[next_ledger]), 8000)     # rolls: 1 MiB segments
                next_ledger += 1
            if rng.random() < 0.5:
                assert await storage.fence(next_ledger, KEY) is None
                live[next_ledger] = 0
                next_ledger += 1
            await storage.checkpoint(only_if_changed=True)
            doomed = rng.sample(sorted(live), k=min(len(live), rng.randint(0, 2)))
            assert await storage.delete_ledgers(doomed) == len(doomed)
            for ledger_id in doomed:
                del live[ledger_id]
            deleted.extend((await storage.compact(0.6)).deleted)
            if round_ % 3 == 2:
                await storage.close()
            else:
                await _crash(storage)
            storage = await _open(tmp_path)
            for ledger_id, entries in live.items():
                assert storage.ledgers[ledger_id].fenced == (entries == 0)
                for entry_id in range(entries):
                    assert storage.read_entry(ledger_id, entry_id).payload == payload_for(ledger_id, entry_id, 8000)
        await storage.close()

    asyncio.run(run())
    assert len(deleted) >= 5 and _journal_records(tmp_path, CheckpointRecord)


def test_an_idle_node_writes_no_checkpoint_and_no_record_however_many_intervals_pass(tmp_path):
    async def run():
        storage = await _open(tmp_path)
        await _add(storage, 1, range(200), 8000)
        assert await storage.delete_ledgers([1]) == 1
        await _add(storage, 2, range(5), 100)
        assert await storage.checkpoint(only_if_changed=True)
        durable, files = storage.journal.durable, sorted(p.name for p in tmp_path.iterdir())
        written = [await storage.checkpoint(only_if_changed=True) for _ in range(20)]
        for _ in range(5):
            await storage.compact(0.5)
        written += [await storage.checkpoint(only_if_changed=True) for _ in range(20)]
        assert written == [False] * 40
        assert storage.journal.durable == durable and sorted(p.name for p in tmp_path.iterdir()) == files
        await _crash(storage)

    asyncio.run(run())
    assert len(_journal_records(tmp_path, CheckpointRecord)) == 1      # the first checkpoint's


def test_a_segment_that_only_a_checkpoint_record_sealed_is_deleted_once_a_checkpoint_covers_past_it(tmp_path):
    """Review of the records: a checkpoint covering the end of a full segment puts its CHECKPOINT record in the next
    one, and a later compaction round, which writes no checkpoint while nothing changed, deleted the full segment
    whose entries were all deleted: the checkpoint then named a segment that was gone, and the node refused to
    start. Then (review 2026-11-29) such a segment was kept by every round of an idle node, up to a segment's bytes:
    the round now writes a checkpoint past it first."""
    async def run():
        storage = await _open(tmp_path)
        entry_id = 0
        while storage.journal.durable.offset < MiB - 2 * 8100:
            await _add(storage, 1, [entry_id], 8000)
            entry_id += 1
        # One more entry leaves the segment 20 bytes short of full: the DELETE record's group (a mark and the record,
        # 34 bytes) fills it, so the checkpoint after it covers the end of segment 1 and its record rolls to 2.
        await _add(storage, 1, [entry_id], MiB - 20 - storage.journal.durable.offset - 17 - 41)
        assert storage.journal.durable.offset == MiB - 20
        assert await storage.delete_ledgers([1]) == 1
        assert storage.journal.durable.segment == 1 and await storage.checkpoint()
        assert storage.journal.durable.segment == 2
        assert (await storage.compact(0.5)).deleted == (1,)   # nothing live, and a checkpoint past it first
        assert storage._checkpointed.segment == 2
        await _crash(storage)
        storage = await _open(tmp_path)                       # its checkpoint and that one's record lie past it
        assert storage.read_entry(1, 0).status != pb.OK
        await storage.close()

    asyncio.run(run())


def test_compaction_deletes_nothing_while_the_newest_checkpoint_has_no_durable_record(tmp_path, monkeypatch):
    real_write = journal_module.SegmentWriter.write
    failures = [2]

    def full_disk(self, buffers, total):
        if failures[0]:
            failures[0] -= 1
            raise JournalWriteError("journal write failed: disk full (injected)") from OSError(errno.ENOSPC, "full")
        return real_write(self, buffers, total)

    async def run():
        storage = await _open(tmp_path)
        await _add(storage, 1, range(200), 8000)
        await _add(storage, 2, range(5), 100)
        assert await storage.delete_ledgers([1]) == 1
        monkeypatch.setattr(journal_module.SegmentWriter, "write", full_disk)
        assert await storage.checkpoint()                   # its record fails
        assert (await storage.compact(0.5)).deleted == ()   # and again when compaction journals it again
        storage.set_read_only("enospc", "")
        assert (await storage.compact(0.5)).deleted         # journaled at last
        await _crash(storage)
        await (await _open(tmp_path)).close()

    asyncio.run(run())


def test_the_newest_delta_lost_from_a_journal_never_compacted_starts_from_the_older_one(tmp_path):
    """Review 2026-11-29: a newer CHECKPOINT record than the checkpoint loaded made the node refuse to start even
    when no journal file was ever removed (segments from 1 on, no compacted file): the replay from the older
    checkpoint restores everything then, as a replay of the whole journal does."""
    async def scenario():
        storage = await _open(tmp_path)
        await _add(storage, 1, range(2000), 100)
        assert await storage.checkpoint()
        await _add(storage, 2, range(5), 100)
        assert await storage.checkpoint()                  # a delta: its record is in the journal
        await _add(storage, 3, range(5), 100)
        await _crash(storage)
        _newest_delta(tmp_path).unlink()
        storage = await _open(tmp_path)
        assert all(storage.read_entry(ledger_id, 4).status == pb.OK for ledger_id in (1, 2, 3))
        await storage.close()

    asyncio.run(scenario())

