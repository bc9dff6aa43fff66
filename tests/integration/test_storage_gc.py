"""Garbage collection on a real node: only ledgers deleted from metadata go, disk use drops, every entry of
the remaining ledgers reads back byte-identical (also while compaction runs, and after a crash); a ledger the
node first saw within --gc-grace stays, and ZooKeeper is synced before it is believed (rule 8)."""
from __future__ import annotations

import asyncio
import collections
import random
import threading
import time

import pytest

from metadata import layout
from metadata.model import Fragment, LedgerMetadata
from metadata.store import MetadataStore
from protos import ledger_pb2 as pb
from protos.digest import password_hash
from storage_node.config import NodeConfig
from storage_node.gc import collect_garbage, deleted_ledgers
from storage_node.storage import Storage
from tests.harness.node_client import PASSWORD, NodeClient, make_entry, payload_for
from tests.harness.poll import poll_until
from tests.harness.stream_fixtures import closed_ledgers

MiB = 1 << 20
ENTRY_BYTES = 8000
GC_ARGS = ("--gc-interval", "0.3", "--gc-grace", "0", "--journal-segment-bytes", str(MiB),
           "--compaction-threshold", "0.8")
GRACE = 3.0


def create_ledgers(store, node_id: str, count: int) -> list[int]:
    """Metadata first, as every writer does: the node only ever holds ledgers that were created."""
    meta = LedgerMetadata(ledger_id=0, ensemble_size=1, write_quorum=1, ack_quorum=1,
                          fragments=(Fragment(0, (node_id,)),), password_hash=password_hash(PASSWORD))
    return [store.create_ledger(meta).value.ledger_id for _ in range(count)]


def write(client: NodeClient, ledgers: list[int], entries: int) -> None:
    """Interleaved, so every segment holds entries of every ledger; one request at a time keeps group
    commits small, so the small segments roll often."""
    for e in range(entries):
        results = client.add(*(make_entry(l, e, payload_for(l, e, ENTRY_BYTES)) for l in ledgers))
        assert all(r.status == pb.OK for r in results)


def journal_files(node) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in (node.data_dir / "journal").glob("*.log")}


def assert_intact(client: NodeClient, live: list[int], deleted: list[int], entries: int) -> None:
    for ledger_id in live:
        got = {}
        for response in client.read_range(ledger_id, 0, entries + 10):
            assert response.status == pb.OK, response.message
            for entry in response.entries:
                assert entry.status == pb.OK, entry.message
                got[entry.entry_id] = entry.payload
        assert got == {e: payload_for(ledger_id, e, ENTRY_BYTES) for e in range(entries)}
        probe = client.read(ledger_id, entries - 1)
        assert probe.status == pb.OK and probe.payload == payload_for(ledger_id, entries - 1, ENTRY_BYTES)
    for ledger_id in deleted:
        assert client.read(ledger_id, 0).status == pb.NO_LEDGER
        assert client.read_lac(ledger_id).status == pb.NO_LEDGER


def test_gc_drops_only_deleted_ledgers_reclaims_disk_and_survives_a_crash(start_node, store):
    node = start_node("gc-node", *GC_ARGS)
    ledgers = create_ledgers(store, node.node_id, 6)
    live, deleted = ledgers[1::2], ledgers[0::2]
    entries = 80
    with NodeClient(node.address) as client:
        write(client, ledgers, entries)
        before = journal_files(node)
        sealed = sorted(before)[:-1]                    # the newest segment is still being written
        assert len(sealed) >= 3
        for ledger_id in deleted:
            store.delete_ledger(ledger_id)

        def reclaimed():
            files = journal_files(node)
            return (client.node_info().ledger_count == len(live) and not set(sealed) & set(files)
                    and sum(files.values()) < 0.65 * sum(before.values()))

        poll_until(reclaimed, timeout=30, what="the node to drop the deleted ledgers and compact its segments")
        assert_intact(client, live, deleted, entries)

    node.restart()
    with NodeClient(node.address) as client:
        assert client.node_info().ledger_count == len(live)
        assert_intact(client, live, deleted, entries)


def test_reads_during_compaction_never_answer_no_entry(start_node, store):
    node = start_node("gc-node", *GC_ARGS)
    entries = 40
    live: list[int] = []
    answers: list[tuple[int, int, int, str]] = []
    stop = threading.Event()

    def hammer() -> None:
        with NodeClient(node.address) as reader:
            while not stop.is_set():
                if not live:
                    continue
                ledger_id, entry_id = random.choice(live), random.randrange(entries)
                response = reader.read(ledger_id, entry_id)
                ok = response.status == pb.OK and response.payload == payload_for(ledger_id, entry_id, ENTRY_BYTES)
                answers.append((ledger_id, entry_id, pb.OK if ok else response.status or -1, response.message))

    thread = threading.Thread(target=hammer, daemon=True)
    thread.start()
    try:
        with NodeClient(node.address) as client:
            for _ in range(3):
                batch = create_ledgers(store, node.node_id, 4)
                write(client, batch, entries)
                live.extend(batch[:2])
                for ledger_id in batch[2:]:
                    store.delete_ledger(ledger_id)
                compacted_before = {n for n in journal_files(node) if n.startswith("compacted")}
                poll_until(lambda: client.node_info().ledger_count == len(live)
                           and {n for n in journal_files(node) if n.startswith("compacted")} - compacted_before,
                           timeout=30, what="a compaction round after the deletes")
    finally:
        stop.set()
        thread.join(10)
    bad = [a for a in answers if a[2] != pb.OK]
    assert not bad, f"{len(bad)} of {len(answers)} reads failed, first: {bad[:3]}"
    assert len(answers) > 100


def collected_at(client: NodeClient, ledger_id: int, timeout: float) -> float:
    """The time the node first answers NO_LEDGER for ledger_id; it must answer OK until then."""
    answers = []

    def gone():
        answers.append(client.read(ledger_id, 0).status)
        return answers[-1] == pb.NO_LEDGER and time.monotonic()

    at = poll_until(gone, timeout, interval=0.02, what=f"the node to drop deleted ledger {ledger_id}")
    assert set(answers[:-1]) <= {pb.OK}, answers
    return at


def test_a_ledger_first_seen_within_the_grace_is_kept_also_after_a_restart(start_node, store):
    node = start_node("gc-node", "--gc-interval", "0.2", "--gc-grace", str(GRACE))
    first, second = create_ledgers(store, node.node_id, 2)
    with NodeClient(node.address) as client:
        sent = time.monotonic()                 # the node cannot have seen either ledger before this
        write(client, [first, second], 3)
        store.delete_ledger(first)
        collected = collected_at(client, first, GRACE + 30)
    assert collected - sent >= GRACE, f"dropped {collected - sent:.2f}s after its first add, within the grace"
    # second is now older than the grace; the node does not keep when it first saw it, so after a restart
    # its grace starts again rather than letting a stale read drop it at once.
    node.kill()
    store.delete_ledger(second)
    restarted = time.monotonic()
    node.start()
    with NodeClient(node.address) as client:
        collected = collected_at(client, second, GRACE + 30)
    assert collected - restarted >= GRACE, f"dropped {collected - restarted:.2f}s after the restart"


class SyncRecordingStore(MetadataStore):
    """A real MetadataStore that records the ZooKeeper calls garbage collection makes, in order."""

    def __init__(self, uri: str):
        self.calls: list[tuple] = []
        super().__init__(uri)

    def sync(self, path: str) -> None:
        self.calls.append(("sync", path))
        super().sync(path)

    def list_ledgers(self) -> list[int]:
        self.calls.append(("list",))
        return super().list_ledgers()

    def read(self, path, decode):
        self.calls.append(("read", path))
        return super().read(path, decode)

    def stat(self, path):
        self.calls.append(("stat", path))
        return super().stat(path)

    def exist(self, paths):
        self.calls.append(("exist", *paths))
        return super().exist(paths)


@pytest.mark.parametrize("other_ledgers", [0, 30])
def test_zookeeper_is_synced_before_the_existence_checks_and_before_every_recheck(metadata_uri, other_ledgers):
    """A follower that has not applied a ledger's creation cannot be staged with one ZooKeeper server, so
    this checks the order of calls against a real one: sync, then the listing (three held ledgers of one in
    metadata) or an exists request for each (three held of 31: fewer than an 8th), then sync before each
    re-read."""
    with SyncRecordingStore(metadata_uri) as store:
        closed_ledgers(store, other_ledgers)
        kept, deleted = create_ledgers(store, "gc-node", 2)
        store.delete_ledger(deleted)
        never_created = deleted + 1000
        held = [kept, deleted, never_created]
        store.calls.clear()
        assert deleted_ledgers(store, held) == [deleted, never_created]
    sync = ("sync", layout.LEDGERS)
    checks = ("exist", *map(layout.ledger_path, held)) if other_ledgers else ("list",)
    assert store.calls == [sync, ("stat", layout.LEDGERS), checks, sync, ("read", layout.ledger_path(deleted)),
                           sync, ("read", layout.ledger_path(never_created))]


class ZooKeeperRequests:
    """Counts the requests a MetadataStore's kazoo client sends, by kind, and the names its listings return (every
    synchronous kazoo call sends its request through the *_async method of its kind)."""

    def __init__(self, store: MetadataStore, monkeypatch):
        self.sent: collections.Counter[str] = collections.Counter()
        self.names_listed = 0
        zk = store.zk
        for kind in ("sync_async", "exists_async", "get_async", "get_children_async"):
            monkeypatch.setattr(zk, kind, self._counted(kind, getattr(zk, kind)))
        listing = zk.get_children

        def get_children(*args, **kwargs):
            names = listing(*args, **kwargs)
            self.names_listed += len(names)
            return names

        monkeypatch.setattr(zk, "get_children", get_children)

    def _counted(self, kind: str, send):
        def counted(*args, **kwargs):
            self.sent[kind] += 1
            return send(*args, **kwargs)
        return counted


def test_a_round_asks_zookeeper_what_the_node_holds_not_what_the_cluster_holds(metadata_uri, tmp_path,
                                                                              monkeypatch):
    """The same four held ledgers (two of them deleted) against 50 and against 2,000 other ledgers in metadata:
    one garbage collection round sends the same requests and lists no names; it drops the deleted two and keeps
    the others. A round whose held ledgers are all within the grace asks ZooKeeper nothing."""
    async def one_round(store: MetadataStore, data_dir, others: int) -> tuple[dict, int]:
        closed_ledgers(store, others)
        storage = Storage(NodeConfig(data_dir=data_dir, port=0, metadata=metadata_uri, node_id="gc-node"))
        await storage.open()
        held = create_ledgers(store, "gc-node", 4)
        results, group = storage.add_batch([make_entry(l, 0, payload_for(l, 0)) for l in held])
        assert all(r.status == pb.OK for r in results) and await group.done is None
        for ledger_id in held[:2]:
            store.delete_ledger(ledger_id)
        within_grace = ZooKeeperRequests(store, monkeypatch)
        assert (await collect_garbage(store, storage, 0.8, grace=3600)).ledgers_deleted == 0
        assert not within_grace.sent
        monkeypatch.undo()
        requests = ZooKeeperRequests(store, monkeypatch)
        assert (await collect_garbage(store, storage, 0.8, grace=0)).ledgers_deleted == 2
        monkeypatch.undo()
        assert sorted(storage.ledgers) == held[2:]
        assert [storage.read_entry(l, 0).status for l in held] == [pb.NO_LEDGER] * 2 + [pb.OK] * 2
        await storage.close()
        return dict(requests.sent), requests.names_listed

    async def scenario():
        with MetadataStore(metadata_uri) as store:
            few = await one_round(store, tmp_path / "few", 50)
            many = await one_round(store, tmp_path / "many", 2000 - 50)
        assert few == many, f"with 50 other ledgers: {few}; with 2,000: {many}"

    asyncio.run(scenario())
