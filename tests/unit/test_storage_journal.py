"""Journal framing and replay without processes: torn tails are dropped, damage in the middle is fatal."""
from __future__ import annotations

import pathlib

import pytest

from protos import ledger_pb2 as pb
from storage_node.checkpoint import SNAPSHOT_NAME, decode_snapshot, encode_snapshot, save_snapshot
from storage_node.entry_index import LedgerIndex, pack, unpack
from storage_node.errors import JournalCorruptError
from storage_node.journal import (
    ENTRY_PAYLOAD_OFFSET,
    FileNumbers,
    Position,
    SegmentReaders,
    SegmentScan,
    SegmentWriter,
    encode_entry_head,
    encode_fence,
    encode_key,
    encode_lac,
    frame_problem,
    read_record,
    segment_path,
)
from storage_node.ledger_state import LedgerState
from storage_node.replay import recover

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
    save_snapshot(tmp_path, encode_snapshot(Position(1, len(first)), {7: state}))
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
    position, ledgers = decode_snapshot(encode_snapshot(Position(2, 99), {3: state}))
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
