"""Crash and restart of a real storage node: acknowledged entries survive; a torn tail or torn last group is
dropped; damage to durable data is never a negative (the node refuses to start instead)."""
from __future__ import annotations

import pathlib

import pytest

from protos import ledger_pb2 as pb
from storage_node.checkpoint import SnapshotDamaged, load_checkpoints
from storage_node.records import MARK_SIZE, encode_durable_mark, encode_entry_head
from tests.harness.node_client import NodeClient, make_entry, payload_for
from tests.harness.poll import poll_until

# Driven with fixed ledger ids that have no metadata: the nodes bind master keys unchecked
# (--bind-keys-unchecked; the check itself: tests/security/test_ledger_claims.py).
pytestmark = pytest.mark.keys_unchecked


def last_segment(node) -> pathlib.Path:
    return sorted((node.data_dir / "journal").glob("segment-*.log"))[-1]


def add_striped_entries(client: NodeClient) -> dict[tuple[int, int], bytes]:
    """Ledger 1: entries 0..199; ledger 2: every third entry only (as with striping). Sizes vary."""
    wanted = {(1, e): payload_for(1, e, 1 + (e * 37) % 5000) for e in range(200)}
    wanted.update({(2, e): payload_for(2, e, 3000) for e in range(0, 90, 3)})
    entries = [make_entry(ledger, entry, payload) for (ledger, entry), payload in wanted.items()]
    results = client.add_batches([entries[i:i + 16] for i in range(0, len(entries), 16)])
    assert {key: r.status for key, r in results.items()} == {key: pb.OK for key in wanted}
    return wanted


def assert_reads_back(client: NodeClient, wanted: dict[tuple[int, int], bytes]) -> None:
    for (ledger, entry), payload in wanted.items():
        read = client.read(ledger, entry)
        assert (read.status, read.payload, read.last_add_confirmed) == (pb.OK, payload, entry - 1)
    for ledger in (1, 2):
        messages = client.read_range(ledger, 0, 1 << 40)
        assert messages[-1].done and all(m.status == pb.OK for m in messages)
        got = {(ledger, e.entry_id): e.payload for m in messages for e in m.entries if e.status == pb.OK}
        assert got == {key: p for key, p in wanted.items() if key[0] == ledger}


def test_acknowledged_entries_survive_sigkill_and_clean_restart(start_node):
    node = start_node()
    with NodeClient(node.address) as client:
        wanted = add_striped_entries(client)
    node.restart()
    with NodeClient(node.address) as client:
        assert_reads_back(client, wanted)
        assert client.read(2, 1).status == pb.NO_ENTRY      # a striping hole: never stored here
        assert client.read(3, 0).status == pb.NO_LEDGER
        assert client.add(make_entry(1, 200, b"after restart"))[0].status == pb.OK
        wanted[(1, 200)] = b"after restart"
    assert node.stop() == 0
    node.start()
    with NodeClient(node.address) as client:
        assert_reads_back(client, wanted)


def test_torn_journal_tail_is_dropped_and_acknowledged_entries_stay(start_node):
    node = start_node()
    with NodeClient(node.address) as client:
        wanted = add_striped_entries(client)
    node.kill()
    partial = make_entry(1, 500, b"z" * 4000)
    with open(last_segment(node), "ab") as segment:
        record = encode_entry_head(1, 500, 499, 0, partial.digest, partial.payload) + partial.payload
        segment.write(record[: len(record) // 2])
    node.start()
    with NodeClient(node.address) as client:
        assert_reads_back(client, wanted)
        assert client.read(1, 500).status == pb.NO_ENTRY
    assert "torn record" in node.log()


def test_garbage_in_the_middle_of_the_journal_refuses_to_start(start_node):
    node = start_node()
    with NodeClient(node.address) as client:
        add_striped_entries(client)
    node.kill()
    segment = last_segment(node)
    data = bytearray(segment.read_bytes())
    middle = data.index(payload_for(1, 50, 1 + (50 * 37) % 5000))
    data[middle:middle + 8] = b"GARBAGE!"
    segment.write_bytes(bytes(data))
    node.start(expect_failure=True)
    assert node.process.returncode != 0
    assert f"journal segment {segment} is damaged at offset" in node.log()
    assert "a durable mark follows it" in node.log() and "refuses to start" in node.log()


def test_a_torn_last_group_after_a_power_cut_is_dropped_and_the_node_starts(start_node):
    node = start_node()
    with NodeClient(node.address) as client:
        wanted = add_striped_entries(client)
    node.kill()
    # The group a power cut interrupted, after the last acknowledged one and over the mark written ahead
    # for it: a later page of it reached the disk, its first page (its mark and first records) did not.
    segment = last_segment(node)
    data = segment.read_bytes()
    mark_at = len(data) - MARK_SIZE
    assert data[mark_at:] == encode_durable_mark(mark_at)
    lost = [make_entry(1, e, payload_for(1, e, 3000)) for e in (500, 501, 502)]
    group = encode_durable_mark(mark_at) + b"".join(
        encode_entry_head(e.ledger_id, e.entry_id, e.last_add_confirmed, 0, e.digest, e.payload) + e.payload
        for e in lost
    )
    segment.write_bytes(data[:mark_at] + bytes(4096) + group[4096:])
    node.start()
    with NodeClient(node.address) as client:
        assert_reads_back(client, wanted)
        assert [client.read(1, e.entry_id).status for e in lost] == [pb.NO_ENTRY] * 3
        assert client.add(make_entry(1, 500, b"after the power cut"))[0].status == pb.OK
    assert "torn record" in node.log()


def test_corrupt_stored_entry_reads_as_error_never_no_entry(start_node):
    node = start_node()
    with NodeClient(node.address) as client:
        wanted = add_striped_entries(client)
    assert node.stop() == 0                      # clean stop: a checkpoint covers the whole journal
    damaged = payload_for(1, 77, 1 + (77 * 37) % 5000)
    segment = next(p for p in (node.data_dir / "journal").glob("segment-*.log") if damaged in p.read_bytes())
    data = bytearray(segment.read_bytes())
    at = data.index(damaged) + 10
    data[at] ^= 0xFF
    segment.write_bytes(bytes(data))
    node.start()
    with NodeClient(node.address) as client:
        read = client.read(1, 77)
        assert read.status == pb.ERROR and "cannot be read back" in read.message
        ranged = {e.entry_id: e for m in client.read_range(1, 70, 80) for e in m.entries}
        assert sorted(ranged) == list(range(70, 81))
        assert ranged[77].status == pb.ERROR
        assert all(ranged[e].payload == wanted[(1, e)] for e in ranged if e != 77)
        assert client.read(1, 78).payload == wanted[(1, 78)]


def test_periodic_checkpoint_then_crash_replays_only_the_tail(start_node):
    node = start_node(None, "--checkpoint-interval", "0.2", "--disk-check-interval", "0.1")
    with NodeClient(node.address) as client:
        wanted = add_striped_entries(client)
        # The checkpoints on disk (the snapshot and its deltas) hold every entry added.
        poll_until(lambda: checkpointed_entries(node.data_dir) >= len(wanted), 30, what="a checkpoint")
        tail = [make_entry(1, e, payload_for(1, e, 700)) for e in range(200, 260)]
        assert all(r.status == pb.OK for r in client.add(*tail))
        wanted.update({(1, e.entry_id): e.payload for e in tail})
    node.restart()
    with NodeClient(node.address) as client:
        assert_reads_back(client, wanted)


def checkpointed_entries(data_dir: pathlib.Path) -> int:
    """Entries the checkpoints in data_dir hold (0 while there are none, or while a new base replaces them)."""
    try:
        loaded = load_checkpoints(data_dir)
    except (SnapshotDamaged, FileNotFoundError):
        return 0
    return sum(state.index.count for state in loaded[1].values()) if loaded is not None else 0


def test_entries_far_above_and_below_what_a_node_holds_survive_checkpoints_and_a_sigkill(start_node):
    """A node chosen again for a ledger 70,010 entries after it left, and given a re-replication's copies of an
    earlier fragment below what it holds: its index moves its window (entry_index.py) and the checkpoint after
    holds the ledger whole (checkpoint.py). Every entry reads back, by id and by range, after checkpoints and a
    SIGKILL, and no entry the node never stored reads as stored."""
    node = start_node(None, "--checkpoint-interval", "0.2")
    far = 1_000 + 70_010
    wanted = {(1, e): payload_for(1, e, 200) for e in [*range(1_000), *range(far, far + 300)]}
    with NodeClient(node.address) as client:
        first = [make_entry(1, e, wanted[(1, e)]) for e in range(1_000)]
        results = client.add_batches([first[i:i + 100] for i in range(0, len(first), 100)])
        assert all(r.status == pb.OK for r in results.values())
        poll_until(lambda: checkpointed_entries(node.data_dir) >= 1_000, 30, what="a checkpoint of the first")
        later = [make_entry(1, e, wanted[(1, e)]) for e in range(far, far + 300)]
        results = client.add_batches([later[i:i + 100] for i in range(0, len(later), 100)])
        assert all(r.status == pb.OK for r in results.values())
        copies = {(1, e): payload_for(1, e, 300) for e in range(40_000, 40_050)}   # an earlier fragment's copies
        assert all(r.status == pb.OK for r in client.add(*(make_entry(1, e, p) for (_, e), p in copies.items())))
        wanted.update(copies)
        poll_until(lambda: checkpointed_entries(node.data_dir) >= len(wanted), 30, what="a checkpoint of all")
    node.kill()
    node.start()
    with NodeClient(node.address) as client:
        messages = client.read_range(1, 0, 1 << 40)
        assert messages[-1].done and all(m.status == pb.OK for m in messages)
        got = {(1, e.entry_id): e.payload for m in messages for e in m.entries if e.status == pb.OK}
        assert got == wanted
        assert [client.read(1, e).status for e in (999, 1_000, 40_049, 40_050, far - 1, far)] == [
            pb.OK, pb.NO_ENTRY, pb.OK, pb.NO_ENTRY, pb.NO_ENTRY, pb.OK]
