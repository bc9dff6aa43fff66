"""The metadata store against a real ZooKeeper: CAS conflicts, the update loop, registry, expiry."""
import threading

import pytest
from kazoo.client import KazooClient

from metadata import layout, registry, streams
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
