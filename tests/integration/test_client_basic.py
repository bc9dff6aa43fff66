"""Write, close and read back against real nodes: striping, async pipelining, batch appends (append_many, on ledgers
and streams), tailing, metadata."""
import pytest

from connector.client import (ClientClosedError, LedgerClient, LedgerClosedError, LedgerFencedError, NoSuchLedgerError,
                              NotEnoughNodesError, Streams, UnauthorizedError, entry_time)
from metadata import streams
from metadata.model import LedgerState
from protos import wire


@pytest.fixture
def client(metadata_uri):
    with LedgerClient(metadata_uri, timeout=3.0) as lc:
        yield lc


def test_append_close_and_read_back_in_order(cluster, client):
    cluster(3)
    with client.create_ledger(3, 3, 2, custom_metadata={"stream": "events"}) as w:
        ids = [w.append(f"entry-{i}".encode()) for i in range(20)]
        assert ids == list(range(20)) and w.last_add_confirmed == 19
    meta = client.ledger_metadata(w.ledger_id)
    assert (meta.state, meta.last_entry_id, meta.custom["stream"], meta.writer_id) == (
        LedgerState.CLOSED, 19, "events", client.writer_id)
    assert meta.length == sum(len(f"entry-{i}") for i in range(20))
    r = client.open_ledger(w.ledger_id)
    assert r.last_entry_id == 19
    assert [(e.entry_id, e.payload) for e in r.read(0, 19)] == [(i, f"entry-{i}".encode()) for i in range(20)]
    assert [e.entry_id for e in r.read(5, 7)] == [5, 6, 7]
    with pytest.raises(LedgerClosedError):
        w.append(b"more")
    assert w.close().last_entry_id == 19  # closing twice is safe


def test_closing_the_client_fails_the_appends_still_waiting_instead_of_leaving_them_forever(cluster, metadata_uri):
    """Helper audit 2026-11-29: a client's close stopped its writers without failing their pending appends, so a
    thread waiting on one waited forever, and so did an append made after the close."""
    nodes = cluster(3)
    lc = LedgerClient(metadata_uri, timeout=3.0)
    w = lc.create_ledger(3, 3, 2)
    assert w.append(b"acknowledged") == 0
    nodes[0].pause()
    nodes[1].pause()   # AQ=2 cannot be reached: the next append waits
    try:
        waiting = w.append_async(b"never acknowledged")
        lc.close()
        with pytest.raises(ClientClosedError, match="before this add was acknowledged"):
            waiting.result(timeout=10)
        with pytest.raises(ClientClosedError):
            w.append_async(b"after the close").result(timeout=10)
    finally:
        nodes[0].resume()
        nodes[1].resume()


def test_striped_pipelined_writes_complete_in_order(cluster, client):
    cluster(5)
    w = client.create_ledger(5, 2, 2)
    done = []
    futures = [w.append_async(bytes([i % 256]) * 100) for i in range(2000)]
    for future in futures:
        future.add_done_callback(lambda f: done.append(f.result()))
    assert [f.result(timeout=60) for f in futures] == list(range(2000))
    assert done == list(range(2000))
    w.close()
    entries = list(client.open_ledger(w.ledger_id).read(0, 1999))
    assert [e.payload for e in entries] == [bytes([i % 256]) * 100 for i in range(2000)]


def test_big_entries_read_as_views_into_the_messages_or_as_bytes(cluster, client):
    """Entries of VIEW_MIN_BYTES or more are decoded by protos.wire (payloads are views into the received message),
    smaller ones by protobuf; either way a reader gets what was written, as bytes unless it asked for views."""
    cluster(3)
    sizes = [wire.VIEW_MIN_BYTES, 3 * wire.VIEW_MIN_BYTES, 100, wire.VIEW_MIN_BYTES + 1, 0, 1 << 20]
    payloads = [bytes([i]) * size for i, size in enumerate(sizes)]
    with client.create_ledger(3, 2, 2, custom_metadata=entry_time.marked()) as w:
        for payload in payloads:
            w.append(entry_time.frame(1_700_000_000_000, payload))
    r = client.open_ledger(w.ledger_id)
    as_bytes, as_views = list(r.read()), list(r.read(views=True))
    assert [e.payload for e in as_bytes] == payloads and {type(e.payload) for e in as_bytes} == {bytes}
    assert [bytes(e.payload) for e in as_views] == payloads
    # Read alone, an entry is the first of its message: a big one is a view into the whole message, a small one
    # (protobuf's bytes) a view into its own payload, the time frame cut off without a copy.
    alone = [next(iter(r.read(i, i, views=True))).payload for i in range(len(sizes))]
    assert [len(p.obj) > len(p) + entry_time.FRAME.size for p in alone] == [True, True, False, True, False, True]
    assert {e.time_ms for e in as_views} == {1_700_000_000_000}


def test_tailing_an_open_ledger_follows_the_lac(cluster, client, metadata_uri):
    cluster(3)
    w = client.create_ledger()
    for i in range(5):
        w.append(b"x%d" % i)
    with LedgerClient(metadata_uri) as reader_client:
        r = reader_client.open_ledger(w.ledger_id, recover=False)
        assert client.ledger_metadata(w.ledger_id).state is LedgerState.OPEN
        assert r.wait_lac(previous=3, timeout=5) == 4  # the idle writer publishes its LAC explicitly
        assert [e.payload for e in r.read(0, 4)] == [b"x%d" % i for i in range(5)]
        w.append(b"x5")
        assert r.wait_lac(timeout=5) == 5
        assert [e.payload for e in r.read(5, 5)] == [b"x5"]
        w.close()
        assert r.read_lac() == 5 and r.is_closed


def test_wrong_password_and_missing_ledger_and_too_few_nodes(cluster, client):
    cluster(2)
    with pytest.raises(NotEnoughNodesError, match="needs 3 writable storage nodes, 2 available"):
        client.create_ledger(3, 3, 2)
    w = client.create_ledger(2, 2, 2, password=b"secret")
    w.append(b"a")
    with pytest.raises(UnauthorizedError, match="wrong password"):
        client.open_ledger(w.ledger_id, password=b"guess")
    with pytest.raises(NoSuchLedgerError):
        client.open_ledger(w.ledger_id + 1000)
    assert w.ledger_id in client.list_ledgers()
    w.close()
    client.delete_ledger(w.ledger_id)
    assert w.ledger_id not in client.list_ledgers()


def test_batches_and_single_appends_get_consecutive_ids_and_read_back_in_order(cluster, client):
    cluster(5)
    w = client.create_ledger(5, 2, 2)
    payloads = [f"entry-{i}".encode() for i in range(3000)]
    futures = [w.append_async(payloads[0]), w.append_many_async(payloads[1:1000]), w.append_async(payloads[1000]),
               w.append_many_async(payloads[1001:2999]), w.append_many_async([])]
    assert w.append_many(payloads[2999:]) == [2999]
    assert futures[0].result(60) == 0 and futures[1].result(60) == list(range(1, 1000))
    assert futures[2].result(60) == 1000 and futures[3].result(60) == list(range(1001, 2999))
    assert futures[4].result(60) == []
    meta = w.close()
    assert meta.last_entry_id == 2999 and meta.length == sum(map(len, payloads))
    assert [e.payload for e in client.open_ledger(w.ledger_id).read(0, 2999)] == payloads
    with pytest.raises(LedgerClosedError):
        w.append_many([b"more"])


def test_a_stream_batch_spans_rolled_ledgers_with_contiguous_offsets(cluster, client):
    cluster(3)
    with Streams(client).open_writer("events", max_ledger_entries=4) as writer:
        assert writer.append(b"e0") == 0
        assert writer.append_many([f"e{i}".encode() for i in range(1, 10)]) == list(range(1, 10))
        assert writer.append_many_async([b"e10", b"e11"]).result(60) == [10, 11]
    record = streams.read_stream(client.store, "events").value
    assert [(l.first_offset, l.last_offset) for l in record.tail] == [(0, 3), (4, 7), (8, 11)]
    assert [(e.offset, e.payload) for e in Streams(client).read("events")] == [
        (i, f"e{i}".encode()) for i in range(12)]
    assert all(e.time_ms is not None for e in Streams(client).read("events"))   # each entry stamped


def test_a_batch_on_a_fenced_ledger_fails_whole(cluster, client, metadata_uri):
    cluster(3)
    w = client.create_ledger(3, 3, 2)
    assert w.append_many([b"a", b"b"]) == [0, 1]
    with LedgerClient(metadata_uri) as other:
        other.recover_ledger(w.ledger_id)   # fences the ledger on its nodes
    future = w.append_many_async([b"c", b"d", b"e"])
    with pytest.raises(LedgerFencedError):
        future.result(60)
    assert [e.payload for e in client.open_ledger(w.ledger_id).read(0, 1)] == [b"a", b"b"]
