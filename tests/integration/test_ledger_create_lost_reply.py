"""A ledger create whose ZooKeeper reply is lost (DESIGN rule 16), against a real ZooKeeper: the create may have
landed, and only its caller knows the id, so the store reads the ledger back and adopts it, or fails saying
nothing was stored; and the stream's update loop reads back its own writes only, never a transform's (a
takeover's transform creates a ledger). The replies are lost by tests/harness/lost_reply.py after ZooKeeper
applied the request."""
import pytest
from kazoo.exceptions import ConnectionLoss

from connector.client import LedgerClient
from metadata import layout, streams
from metadata.errors import MetadataError
from metadata.model import LedgerState, StreamRecord
from metadata.store import no_reply
from tests.harness.lost_reply import LostReplies


def creates(prefix):
    """A ledger's create: a create or a multi creating /ledgers/L... (with the placement and guard checks)."""
    return lambda operation, path, kwargs: operation in ("create", "multi") and f"{prefix}L" in path


@pytest.fixture
def client(cluster, metadata_uri):
    cluster(3)
    with LedgerClient(metadata_uri) as c:
        yield c


def test_a_ledger_create_whose_reply_is_lost_adopts_the_ledger(client, monkeypatch):
    lost = LostReplies(monkeypatch, creates(f"{layout.LEDGERS}/"))
    handle = client.create_ledger(custom_metadata={"app": "a"})
    assert lost.lost and client.list_ledgers() == [handle.ledger_id]
    assert handle.append(b"p") == 0
    handle.close()
    meta = client.ledger_metadata(handle.ledger_id)
    assert meta.state is LedgerState.CLOSED and meta.last_entry_id == 0 and meta.writer_id == client.writer_id


def test_a_guarded_ledger_create_whose_reply_is_lost_adopts_the_ledger(client, monkeypatch):
    """A Spark task's create (jobs.create_task_ledger): in a multi with its registry entry's check."""
    guard = f"{layout.SPARK_JOBS}/job-1"
    client.store.create(guard)
    ledger_id = client.store.allocate_ledger_id()
    lost = LostReplies(monkeypatch, creates(f"{layout.LEDGERS}/"))
    handle = client.create_ledger(ledger_id=ledger_id, guard=guard)
    assert lost.lost and handle.ledger_id == ledger_id and client.list_ledgers() == [ledger_id]
    assert handle.append(b"p") == 0
    handle.close()


def test_a_ledger_create_whose_reply_is_lost_and_that_is_not_there_fails_saying_so(client, monkeypatch):
    """Read back, the ledger is not there (here it is deleted before the read-back, as if the create had not
    landed): an error that says nothing was stored, which is no lost reply (no caller reads it back again)."""
    def deleted():
        [ledger_id] = client.store.list_ledgers()
        client.store.delete_ledger(ledger_id)

    LostReplies(monkeypatch, creates(f"{layout.LEDGERS}/"), meanwhile=deleted)
    with pytest.raises(MetadataError, match="was not created.*found no ledger") as raised:
        client.create_ledger()
    assert not no_reply(raised.value) and client.list_ledgers() == []


def test_a_lost_reply_of_a_transforms_own_request_is_not_read_back_as_the_streams(store):
    """Lost-reply audit 2026-11-29 (finding 2): update_stream(read_back=True) took any lost reply raised inside the
    transform for one of its own head write, and ran the transform again."""
    streams.create_stream(store, StreamRecord("events", "raw"))
    calls = []

    def transform(record):
        calls.append(record)
        if len(calls) == 1:
            raise MetadataError("ZooKeeper request failed: ConnectionLoss (the transform's own)") from ConnectionLoss()
        return record.replace(owner="changed")

    with pytest.raises(MetadataError, match="the transform's own"):
        streams.update_stream(store, "events", transform, read_back=True)
    assert len(calls) == 1 and streams.read_stream(store, "events").value.owner == ""
