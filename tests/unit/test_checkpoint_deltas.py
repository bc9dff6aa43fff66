"""Checkpoint deltas (storage_node/checkpoint.py): a checkpoint holds what changed since the last one, and the base
with its deltas holds exactly the state a whole snapshot would. Checked on a real Storage in a temporary
directory through random operations of every kind that changes what a checkpoint holds (adds, recovery adds into
holes and far ids, fences, LACs, a read-only node's LACs, deletes and a late writer's re-creation, compaction's
moves), loading the checkpoints after each one and restarting now and then; and the chain's files: a new base
removes older deltas, a missing or damaged delta is refused, not skipped."""
from __future__ import annotations

import asyncio
import random

import crc32c
import pytest

from protos import ledger_pb2 as pb
from storage_node import checkpoint
from storage_node.checkpoint import (
    DELTA_PREFIX,
    SNAPSHOT_NAME,
    SnapshotDamaged,
    delta_name,
    encode_snapshot,
    load_checkpoints,
)
from storage_node.config import NodeConfig
from storage_node.errors import JournalCorruptError
from storage_node.ledger_state import LedgerState
from storage_node.replay import recover
from storage_node.segments import Position
from storage_node.storage import Storage
from tests.harness.node_client import KEY, make_entry, payload_for

MiB = 1 << 20
LEDGERS = (1, 2, 3, 4)


def _config(path) -> NodeConfig:
    return NodeConfig(data_dir=path, port=0, metadata="zk://127.0.0.1:1/unused", node_id="unit",
                      journal_segment_bytes=MiB)


def held(ledgers: dict[int, LedgerState]) -> dict:
    """What a checkpoint holds of each ledger, comparable."""
    return {
        ledger_id: (state.master_key, state.fenced, state.last_add_confirmed, state.last_entry_id, state.index.base,
                    list(state.index.locations), list(state.index.lengths), dict(state.index.overflow),
                    state.index.count, dict(state.index.bytes_by_file))
        for ledger_id, state in ledgers.items()
    }


class Node:
    """A Storage and the operations the random runs take on it."""

    def __init__(self, path, rng: random.Random):
        self.path = path
        self.rng = rng
        self.storage: Storage | None = None
        self.next_entry = {ledger_id: 0 for ledger_id in LEDGERS}
        self.holes: dict[int, list[int]] = {ledger_id: [] for ledger_id in LEDGERS}
        self.kinds: set[str] = set()

    async def open(self) -> None:
        self.storage = Storage(_config(self.path))
        await self.storage.open()

    async def add(self, ledger_id: int) -> None:
        entries, entry_id = [], self.next_entry[ledger_id]
        for _ in range(self.rng.randint(1, 12)):
            if self.rng.random() < 0.1:
                self.holes[ledger_id].append(entry_id)      # left out: a recovery add fills it later
            else:
                entries.append(make_entry(ledger_id, entry_id, payload_for(ledger_id, entry_id, 9000)))
            entry_id += 1
        self.next_entry[ledger_id] = entry_id
        await self._stored(entries)

    async def fill_hole(self, ledger_id: int) -> None:
        if self.holes[ledger_id]:
            entry_id = self.holes[ledger_id].pop(0)
            await self._stored([make_entry(ledger_id, entry_id, payload_for(ledger_id, entry_id, 500),
                                           recovery=True)])
            self.kinds.add("hole")

    async def far(self, ledger_id: int) -> None:
        entry_id = self.next_entry[ledger_id] + (1 << 30) + self.rng.randint(0, 1000)
        await self._stored([make_entry(ledger_id, entry_id, payload_for(ledger_id, entry_id, 300), recovery=True)])
        self.kinds.add("overflow")

    async def _stored(self, entries) -> None:
        if not entries:
            return
        results, group = self.storage.add_batch(entries)
        if group is not None:
            assert await group.done is None
        self.kinds.add("add" if all(r[2] == pb.OK for r in results) else "refused")

    async def fence(self, ledger_id: int) -> None:
        assert await self.storage.fence(ledger_id, KEY) is None
        self.kinds.add("fence")

    async def lac(self, ledger_id: int) -> None:
        """An explicit LAC of a ledger the node holds that is not fenced (this one if it can)."""
        open_ledgers = [l for l in (ledger_id, *LEDGERS)
                        if l in self.storage.ledgers and not self.storage.ledgers[l].fenced]
        if open_ledgers:
            ledger_id = open_ledgers[0]
            assert await self.storage.write_lac(ledger_id, KEY, self.next_entry[ledger_id] - 1) is None
            self.kinds.add("lac")

    async def key_only(self, ledger_id: int) -> None:
        """A LAC of -1 for a ledger the node never saw: it holds the ledger, with its key and nothing else."""
        fresh = 100 + ledger_id * 1000 + self.rng.randint(0, 999)
        if fresh not in self.storage.ledgers:
            assert await self.storage.write_lac(fresh, KEY, -1) is None
            self.kinds.add("key only")

    async def read_only_lac(self, ledger_id: int) -> None:
        if ledger_id in self.storage.ledgers and not self.storage.ledgers[ledger_id].fenced:
            self.storage.set_read_only("test", "a test")
            try:
                assert await self.storage.write_lac(ledger_id, KEY, self.next_entry[ledger_id] + 5) is None
            finally:
                self.storage.set_read_only("test", "")
            self.kinds.add("read-only lac")

    async def delete(self, ledger_id: int) -> None:
        if await self.storage.delete_ledgers([ledger_id]):
            self.next_entry[ledger_id], self.holes[ledger_id] = 0, []   # a late writer starts it again
            self.kinds.add("delete")

    async def compact(self) -> None:
        if (await self.storage.compact(0.95)).rewritten:
            self.kinds.add("compaction")

    async def checkpoint(self) -> None:
        durable = self.storage.journal.durable        # what it covers (its CHECKPOINT record follows)
        wrote = await self.storage.checkpoint(only_if_changed=self.rng.random() < 0.5)
        if wrote:
            loaded = load_checkpoints(self.path)
            assert loaded is not None
            position, ledgers, chain = loaded
            assert position == durable
            assert held(ledgers) == held(self.storage.ledgers)
            self.kinds.add("delta" if chain.deltas else "base")

    async def delete_amid_adds(self, ledger_id: int) -> None:
        """Garbage collection drops a ledger whose adds are journaled but not yet applied (they apply to the
        dropped state)."""
        await asyncio.gather(self.add(ledger_id), self.delete(ledger_id))

    def counts_match(self) -> None:
        """The counts Storage keeps for its gauges are what a walk over its ledgers counts."""
        ledgers = self.storage.ledgers.values()
        assert self.storage.entry_count() == sum(state.index.count for state in ledgers)
        assert self.storage.fenced_count() == sum(1 for state in ledgers if state.fenced)

    async def checkpoint_amid_adds(self, ledger_id: int) -> None:
        """A checkpoint encoded and saved while adds are journaled and applied around it (the next comparison,
        at rest, shows nothing they changed was lost from the deltas)."""
        other = LEDGERS[(LEDGERS.index(ledger_id) + 1) % len(LEDGERS)]
        await asyncio.gather(self.add(ledger_id), self.storage.checkpoint(), self.add(other))
        self.kinds.add("concurrent")

    async def restart(self) -> None:
        before = held(self.storage.ledgers)
        await self.storage.close()
        await self.open()
        assert held(self.storage.ledgers) == before
        self.counts_match()
        self.kinds.add("restart")


@pytest.mark.parametrize("seed", range(8))
def test_the_base_with_its_deltas_holds_what_a_whole_snapshot_would(tmp_path, seed):
    rng = random.Random(seed)
    node = Node(tmp_path, rng)

    async def run():
        await node.open()
        operations = [node.add] * 8 + [node.fill_hole, node.far, node.fence, node.lac, node.key_only,
                                       node.read_only_lac, node.delete, node.delete_amid_adds,
                                       node.checkpoint_amid_adds]
        for step in range(150):
            await rng.choice(operations)(rng.choice(LEDGERS))
            node.counts_match()
            if step % 5 == 4:
                await node.checkpoint()
            if step % 40 == 39:
                await node.compact()
                await node.checkpoint()
            if step % 70 == 69:
                await node.restart()
        await node.restart()
        await node.storage.close()

    asyncio.run(run())
    assert node.kinds == {"add", "refused", "hole", "overflow", "fence", "lac", "key only", "read-only lac",
                          "delete", "compaction", "concurrent", "delta", "base", "restart"}


def test_over_many_checkpoints_each_writes_what_changed_and_bases_come_back_as_deltas_add_up(tmp_path):
    async def run():
        storage = Storage(_config(tmp_path))
        await storage.open()
        sizes = []
        for round_ in range(40):
            for ledger_id in LEDGERS:
                entries = [make_entry(ledger_id, e, payload_for(ledger_id, e, 200))
                           for e in range(round_ * 50, round_ * 50 + 50)]
                _, group = storage.add_batch(entries)
                assert await group.done is None
            assert await storage.checkpoint()
            sizes.append(_checkpoint_files(tmp_path))
        await storage.close()
        return sizes

    sizes = asyncio.run(run())
    deltas = [files for files in sizes if any(name.startswith(DELTA_PREFIX) for name in files)]
    assert deltas, sizes
    # A delta holds the 200 entries of its round (12 bytes of index each), not the thousands held by then.
    for files in deltas:
        newest = max((name for name in files if name.startswith(DELTA_PREFIX)),
                     key=lambda name: int(name.rsplit("-", 1)[1]))
        assert files[newest] < 200 * 12 + 4 * 200
    # A new base removes the older generation's deltas; deltas never add up to much more than their base.
    for files in sizes:
        generations = {name.split("-")[2] for name in files if name.startswith(DELTA_PREFIX)}
        assert len(generations) <= 1
        assert sum(size for name, size in files.items() if name.startswith(DELTA_PREFIX)) \
            <= 2 * files[SNAPSHOT_NAME]


def _checkpoint_files(path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in path.iterdir()
            if p.name == SNAPSHOT_NAME or p.name.startswith(DELTA_PREFIX)}


async def _base_and_two_deltas(path) -> None:
    storage = Storage(_config(path))
    await storage.open()
    for batch in (range(200), range(200, 201), range(201, 202)):     # a base, then two small deltas
        _, group = storage.add_batch([make_entry(1, entry_id, payload_for(1, entry_id)) for entry_id in batch])
        assert await group.done is None
        assert await storage.checkpoint()
    assert load_checkpoints(path)[2].deltas == 2
    await storage.journal.close()    # no checkpoint at close: the base and its two deltas stay as they are


def test_a_delta_missing_between_others_is_refused_not_skipped(tmp_path):
    asyncio.run(_base_and_two_deltas(tmp_path))
    generation = load_checkpoints(tmp_path)[2].generation
    (tmp_path / delta_name(generation, 1)).unlink()
    with pytest.raises(SnapshotDamaged, match="delta 1 of generation .* is missing"):
        load_checkpoints(tmp_path)


def test_a_damaged_delta_is_replayed_around_while_the_journal_is_whole_and_refused_once_it_is_not(tmp_path):
    asyncio.run(_base_and_two_deltas(tmp_path))
    generation = load_checkpoints(tmp_path)[2].generation
    delta = tmp_path / delta_name(generation, 2)
    blob = delta.read_bytes()
    delta.write_bytes(blob[:-1] + bytes([blob[-1] ^ 0xFF]))
    with pytest.raises(SnapshotDamaged, match="checksum"):
        load_checkpoints(tmp_path)
    recovered = recover(tmp_path, tmp_path / "journal")          # the whole journal is there: replayed
    assert list(recovered.ledgers[1].index.entries_between(0, 1000)) == list(range(202))
    assert any("damaged checkpoint" in note for note in recovered.notes)
    (tmp_path / "journal" / "compacted-99.log").write_bytes(b"")  # as if compaction had run
    with pytest.raises(JournalCorruptError, match="damaged"):
        recover(tmp_path, tmp_path / "journal")


@pytest.mark.parametrize("damaged", ["delta", "base", "base generation"])
def test_after_damaged_checkpoints_are_replayed_around_the_next_base_takes_a_generation_of_its_own(tmp_path, damaged):
    """The deltas left by the damaged chain must never be taken for the new base's own: found by review, where the
    new base reused generation 1 and the next start applied the old deltas to it (or refused to start). Nor is a
    damaged base's generation trusted (a damaged one of 2**63 - 1 made every later checkpoint fail)."""
    asyncio.run(_base_and_two_deltas(tmp_path))
    old = load_checkpoints(tmp_path)[2]
    target = tmp_path / (delta_name(old.generation, 2) if damaged == "delta" else SNAPSHOT_NAME)
    blob = target.read_bytes()
    if damaged == "base generation":
        at = checkpoint._HEADER.size
        target.write_bytes(blob[:at] + (2 ** 63 - 1).to_bytes(8, "little") + blob[at + 8:])
    else:
        target.write_bytes(blob[:-1] + bytes([blob[-1] ^ 0xFF]))

    async def restart_and_checkpoint():
        storage = Storage(_config(tmp_path))
        await storage.open()                         # the whole journal replayed around the damage
        assert await storage.checkpoint()
        _, group = storage.add_batch([make_entry(2, 0, payload_for(2, 0))])
        assert await group.done is None
        expected = held(storage.ledgers), storage.journal.durable
        assert await storage.checkpoint()            # and a delta of the new base
        await storage.journal.close()
        return expected

    expected_ledgers, expected_position = asyncio.run(restart_and_checkpoint())
    position, ledgers, chain = load_checkpoints(tmp_path)
    assert chain.generation > old.generation and chain.deltas == 1
    assert (held(ledgers), position) == (expected_ledgers, expected_position)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(delta_name(old.generation, 0)[:-1])]


def test_a_snapshot_of_the_format_before_deltas_loads_as_generation_0(tmp_path):
    state = LedgerState(5, KEY, last_entry_id=0)
    state.index.put(0, 1 << 40, 100)
    blob = bytes(encode_snapshot(Position(1, 100), {5: state}, generation=7))
    # The format before: magic LSNAP001 and no (generation, number) ahead of the position.
    body = blob[checkpoint._HEADER.size + checkpoint._CHAIN.size:]
    (tmp_path / SNAPSHOT_NAME).write_bytes(checkpoint._HEADER.pack(b"LSNAP001", crc32c.crc32c(body), len(body)) + body)
    position, ledgers, chain = load_checkpoints(tmp_path)
    assert (position, chain.generation, chain.deltas) == (Position(1, 100), 0, 0)
    assert held(ledgers) == held({5: state})


def test_a_checkpoint_holds_the_state_it_was_encoded_at_not_what_changed_while_it_was_saved(tmp_path):
    """Storage.checkpoint encodes on the event loop and saves in a worker thread while the loop goes on changing
    the index: what is saved must be copies taken at the encoding, never views of the live arrays."""
    state = LedgerState(5, KEY, last_entry_id=2)
    for entry_id in range(3):
        state.index.put(entry_id, (1 << 40) + 100 * entry_id, 100)
    state.index.put(1 << 30, (1 << 40) + 900, 50)           # far ahead: the overflow dict
    expected = held({5: state})
    base = encode_snapshot(Position(1, 300), {5: state}, generation=1)
    state.index.mark_checkpointed()
    state.index.put(3, (1 << 40) + 300, 100)
    delta = checkpoint.encode_delta(Position(1, 400), 1, 1, [state], [])
    expected_with_delta = held({5: state})
    # What the loop does meanwhile: appends, a compaction move, an overflow entry.
    state.index.put(4, (1 << 40) + 400, 100)
    state.index.put(0, (2 << 40) + 8, 100)
    state.index.put((1 << 30) + 1, (1 << 40) + 950, 50)
    state.last_entry_id = 4
    checkpoint.save_snapshot(tmp_path, base)
    position, ledgers, chain = load_checkpoints(tmp_path)
    assert (position, held(ledgers), chain.deltas) == (Position(1, 300), expected, 0)
    checkpoint.save_delta(tmp_path, delta)
    position, ledgers, chain = load_checkpoints(tmp_path)
    assert (position, held(ledgers), chain.deltas) == (Position(1, 400), expected_with_delta, 1)
    assert (tmp_path / SNAPSHOT_NAME).stat().st_size == base.size
    assert (tmp_path / SNAPSHOT_NAME).read_bytes() == bytes(base)


def test_a_checkpoint_cancelled_while_saving_holds_the_next_one_until_its_save_is_done(tmp_path, monkeypatch):
    """Helper audit 2026-11-29: the node's stop cancels the garbage collector while its compaction's checkpoint is
    being saved in a worker thread; the cancel released the checkpoint lock at once, and close()'s checkpoint then
    wrote the same snapshot.tmp beside the first save, which could rename a half-written file over the good
    snapshot (and the second save's rename failed). The second save must start only once the first has ended."""
    import threading

    from storage_node import storage as storage_module

    events, release = [], threading.Event()
    real_save = storage_module.save_snapshot

    def save(data_dir, encoded):
        first = not events
        events.append("start")
        if first:
            assert release.wait(30)
        real_save(data_dir, encoded)
        events.append("end")

    monkeypatch.setattr(storage_module, "save_snapshot", save)

    async def scenario():
        storage = Storage(_config(tmp_path))
        await storage.open()
        for entry_id in range(20):
            _, group = storage.add_batch([make_entry(1, entry_id, payload_for(1, entry_id))])
            assert await group.done is None
        collector = asyncio.ensure_future(storage.checkpoint())   # the first after a start: a whole snapshot
        while not events:
            await asyncio.sleep(0.001)
        collector.cancel()
        await asyncio.sleep(0.05)
        closing = asyncio.ensure_future(storage.close())          # its checkpoint
        await asyncio.sleep(0.05)
        assert events == ["start"], events                        # close()'s save waits for the first
        release.set()
        await asyncio.gather(collector, return_exceptions=True)
        await closing
        assert events in (["start", "end"], ["start", "end", "start", "end"]), events

    asyncio.run(scenario())
    position, ledgers, _ = load_checkpoints(tmp_path)
    assert ledgers[1].last_entry_id == 19


def test_a_delta_after_the_window_moved_holds_the_ledger_whole(tmp_path):
    """The window of a ledger's index moves when an entry comes far above it (entry_index.py): the delta after it
    holds the ledger whole, among the dropped too, as the decoder (also a node's of the version before) expects a
    changed ledger's new slots to continue the window the checkpoints before hold."""
    state = LedgerState(5, KEY, last_entry_id=99)
    for entry_id in range(100):
        state.index.put(entry_id, (1 << 40) + 100 * entry_id, 100)
    base = encode_snapshot(Position(1, 300), {5: state}, generation=1)
    state.index.mark_checkpointed()
    far = 100 + 70_000
    for entry_id in range(far, far + 50):
        state.index.put(entry_id, (2 << 40) + 100 * (entry_id - far), 100)
    state.last_entry_id = far + 49
    assert state.index.base == far and state.index.rewritten()
    delta = checkpoint.encode_delta(Position(2, 5_000), 1, 1, [state], [])
    expected = held({5: state})
    checkpoint.save_snapshot(tmp_path, base)
    checkpoint.save_delta(tmp_path, delta)
    position, ledgers, chain = load_checkpoints(tmp_path)
    assert (position, held(ledgers), chain.deltas) == (Position(2, 5_000), expected, 1)
    index = ledgers[5].index
    assert index.get(50) == ((1 << 40) + 5_000, 100) and index.get(far + 1) == ((2 << 40) + 100, 100)
    state.index.mark_checkpointed()
    state.index.put(far + 50, (2 << 40) + 5_000, 100)
    assert not state.index.rewritten() and state.index.changes()[:2] == (50, [])   # deltas again from here on
