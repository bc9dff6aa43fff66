"""append_many: several entries per call, each still its own add, in order with single appends, on ledgers and
streams (across rolls), against real nodes."""
import pytest

from connector.client import LedgerClient, LedgerClosedError, LedgerFencedError, Streams
from metadata import streams


@pytest.fixture
def client(metadata_uri):
    with LedgerClient(metadata_uri, timeout=3.0) as lc:
        yield lc


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
