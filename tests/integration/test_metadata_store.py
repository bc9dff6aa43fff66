"""The metadata store against a real ZooKeeper: CAS conflicts, the update loop, registry, expiry."""
import threading

import pytest
from kazoo.client import KazooClient

from connector.client import LedgerClient
from metadata import layout, ledger_ids, registry, streams
from metadata.errors import (
    InvalidMetadataUriError,
    MetadataConflictError,
    MetadataError,
    NoSuchLedgerError,
    NoSuchStreamError,
    StreamExistsError,
)
from metadata.model import Fragment, LedgerMetadata, LedgerState, NodeRegistration, StreamLedger, StreamRecord
from metadata.store import MetadataStore
from metadata.update_loop import update_ledger
from tests.harness.poll import poll_until


def new_ledger(store):
    return store.create_ledger(LedgerMetadata(0, 3, 3, 2, (Fragment(0, ("a", "b", "c")),)))


def test_ledger_ids_are_unique_and_records_versioned(store):
    first, second = new_ledger(store), new_ledger(store)
    assert first.value.ledger_id != second.value.ledger_id
    assert store.read_ledger(first.value.ledger_id) == first
    assert store.list_ledgers() == sorted([first.value.ledger_id, second.value.ledger_id])


def test_ids_allocated_in_bulk_are_new_and_come_before_later_ones(store):
    before = store.allocate_ledger_id()
    bulk = store.allocate_ledger_ids(25, per_request=10)
    assert bulk == sorted(set(bulk)) and len(bulk) == 25 and bulk[0] > before
    assert store.allocate_ledger_id() > bulk[-1]
    assert store.children(layout.IDGEN) == []


def test_compare_and_set_with_a_stale_version_is_a_conflict(store):
    created = new_ledger(store)
    ledger_id = created.value.ledger_id
    store.write_ledger(created.value.replace(length=1), created.version)
    with pytest.raises(MetadataConflictError, match=f"ledger {ledger_id} metadata changed"):
        store.write_ledger(created.value.replace(length=2), created.version)
    assert store.read_ledger(ledger_id).value.length == 1


def test_update_loop_applies_every_concurrent_update_exactly_once(store, metadata_uri):
    ledger_id = new_ledger(store).value.ledger_id

    def bump(times):
        with MetadataStore(metadata_uri) as own:
            for _ in range(times):
                update_ledger(own, ledger_id, lambda m: m.replace(length=m.length + 1))

    threads = [threading.Thread(target=bump, args=(20,)) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.read_ledger(ledger_id).value.length == 100


def test_update_loop_stops_when_the_transform_declines(store):
    created = new_ledger(store)
    closed = update_ledger(store, created.value.ledger_id, lambda m: m.closed_at(5, 10))

    def close_if_open(meta):
        return None if meta.state is LedgerState.CLOSED else meta.closed_at(1, 1)

    assert update_ledger(store, created.value.ledger_id, close_if_open, current=created) == closed


def test_missing_ledger_and_bad_uri_are_clear_errors(store):
    with pytest.raises(NoSuchLedgerError, match="ledger 123456 does not exist"):
        store.read_ledger(123456)
    with pytest.raises(InvalidMetadataUriError, match="zk://host:port"):
        MetadataStore("http://127.0.0.1/ledgers")


def test_unreachable_zookeeper_is_a_clear_error():
    with pytest.raises(MetadataError, match="cannot reach ZooKeeper"):
        MetadataStore("zk://127.0.0.1:1/ledgers", connect_timeout=1)


def test_stream_records_use_compare_and_set(store):
    streams.create_stream(store, StreamRecord("events", "raw"))
    with pytest.raises(StreamExistsError):
        streams.create_stream(store, StreamRecord("events", "raw"))
    stale = streams.read_stream(store, "events")
    streams.update_stream(store, "events", lambda s: s.replace(tail=s.tail + (StreamLedger(7, 0, 9),)))
    with pytest.raises(MetadataConflictError):
        streams.write_stream(store, stale.value.replace(owner="x"), stale.version)
    assert streams.read_stream(store, "events").value.next_offset == 10
    with pytest.raises(NoSuchStreamError, match="'nope' does not exist"):
        streams.read_stream(store, "nope")
    with pytest.raises(streams.InvalidStreamNameError):
        streams.read_stream(store, "../etc")


def expire_session(store, zookeeper):
    """Expire store's ZooKeeper session the way kazoo's own test harness does."""
    session_id, password = store.zk.client_id
    other = KazooClient(hosts=zookeeper.address, client_id=(session_id, password))
    other.start(timeout=15)
    other.stop()
    other.close()


def test_ephemeral_registrations_come_back_after_session_expiry(store, zookeeper):
    writer = registry.register_writer(store, "writer-1")
    node = registry.register_node(store, NodeRegistration("node-9", "127.0.0.1:1"))
    assert registry.writer_alive(store, "writer-1")
    old_session = store.zk.client_id[0]
    expire_session(store, zookeeper)
    poll_until(lambda: store.zk.client_id and store.zk.client_id[0] != old_session, 30, what="a new session")
    poll_until(lambda: registry.writer_alive(store, "writer-1"), 30, what="writer re-registration")
    poll_until(lambda: "node-9" in registry.list_nodes(store), 30, what="node re-registration")
    writer.close()
    node.close()
    assert not registry.writer_alive(store, "writer-1")
    assert store.zk.exists(layout.node_path("node-9")) is None


def test_ledger_ids_move_to_the_next_bucket_before_zookeepers_counter_wraps(store, metadata_uri, cluster):
    """Day-300 audit 2026-11-29: ids were the sequence numbers of one parent, whose signed 32-bit counter ZooKeeper
    advances on every create and delete of a child; once it wrapped, names such as id--2147483648 parsed as
    2147483648, then 2147483646, ...: ids already handed out. Ids now come in buckets opened before the wrap."""
    store._ledger_ids = ledger_ids.LedgerIds(store, roll_at=store.allocate_ledger_id() + 6)
    taken = [store.allocate_ledger_id() for _ in range(4)] + store.allocate_ledger_ids(5, per_request=2)
    taken += [store.allocate_ledger_id() for _ in range(3)]
    assert taken == sorted(set(taken))
    assert taken[0] < 2**31 and taken[-1] >= 2**31          # the first bucket, then the next
    assert store.children(layout.IDGEN) == ["bucket-0000000001"]
    assert store.children(ledger_ids.bucket_path(1)) == []
    # another client, starting afresh, takes its ids from the highest bucket
    with MetadataStore(metadata_uri) as other:
        assert other.allocate_ledger_id() > taken[-1]
    # a ledger with an id of the second bucket is written and read like any other
    cluster(3)
    with LedgerClient(metadata_uri, timeout=3.0) as lc:
        with lc.create_ledger(3, 3, 2) as w:
            assert w.ledger_id >= 2**31 and w.append(b"first") == 0
        assert [e.payload for e in lc.open_ledger(w.ledger_id).read(0, 0)] == [b"first"]


def test_a_wrapped_sequence_number_is_never_taken_for_an_id(store, monkeypatch):
    """ZooKeeper's counter for a parent's sequential children wraps to -2147483648 (written id--2147483648): such
    a name must not give an id (it gave 2147483648, then ids going down through those already used)."""
    before = store.allocate_ledger_id()
    real_create, wrapped = store.zk.create, iter(["-2147483648", "-2147483646"])

    def create(path, *args, **kwargs):
        if path == f"{layout.IDGEN}/id-" and (suffix := next(wrapped, None)) is not None:
            return f"{layout.IDGEN}/id-{suffix}"   # what ZooKeeper names a child past the wrap
        return real_create(path, *args, **kwargs)

    real_delete = store.zk.delete
    monkeypatch.setattr(store.zk, "create", create)
    monkeypatch.setattr(store.zk, "delete", lambda path, *a, **k: None if "--" in path else real_delete(path, *a, **k))
    taken = [store.allocate_ledger_id() for _ in range(3)]
    assert [before] + taken == sorted(set([before] + taken))
    assert all(ledger_id >= 2**31 for ledger_id in taken)
    assert store.children(layout.IDGEN) == ["bucket-0000000001"]
