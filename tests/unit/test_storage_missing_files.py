"""A data directory missing files the node wrote (storage_node/replay.py): a journal segment after the checkpoint
deleted or cut short at a record boundary made the node start and answer NO_LEDGER for what it had acknowledged
(storage audit 2026-11-30); it refuses to start now, by the journal's LINK records."""
from __future__ import annotations

import asyncio
import errno
import os

import pytest

from protos import ledger_pb2 as pb
from storage_node import journal as journal_module
from storage_node.config import NodeConfig
from storage_node.errors import JournalCorruptError, JournalWriteError
from storage_node.records import LinkRecord, decode
from storage_node.segments import SegmentScan, list_segments, segment_path
from storage_node.storage import Storage
from tests.harness.node_client import make_entry, payload_for

MiB = 1 << 20


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
