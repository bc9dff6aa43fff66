"""Idempotent stream updates whose ZooKeeper reply was lost (DESIGN rule 16), against a real ZooKeeper: the seal of
a recovered dangling tail (connector/spark/spans.py: Spark read planning, a streaming source's latestOffset, a
write's prepare), a retention change (connector/retention.py) and the creation of a stream a Spark write starts
(connector/spark/write.py ensure_stream) read back what landed instead of raising. Lost-reply audit 2026-11-29,
finding 4: each raised MetadataError (ConnectionLoss) although its update had landed. The replies are lost by
tests/harness/lost_reply.py after ZooKeeper applied the request."""
from connector.client import LedgerClient, Streams
from connector.retention import set_retention
from connector.spark.spans import stream_spans
from connector.spark.write import ensure_stream
from metadata import streams
from metadata.model import StreamRecord
from tests.harness.lost_reply import LostReplies


def head_write(name: str, operation: str = "SetData"):
    """The multi that sets (or creates) the stream's head."""
    return lambda op, path, kwargs: op == "multi" and any(
        part.startswith(f"{operation}:") and part.endswith(f"/streams/{name}") for part in path.split())


def test_the_seal_of_a_recovered_tail_whose_reply_is_lost_is_read_back(cluster, metadata_uri, monkeypatch):
    cluster(3)
    writer_client = LedgerClient(metadata_uri)
    writer = Streams(writer_client).open_writer("raw")
    for i in range(3):
        writer.append(b"p%d" % i)
    writer_client.close()   # the writer dies: its OPEN ledger is dangling
    with LedgerClient(metadata_uri) as lc:
        record = streams.read_stream(lc.store, "raw").value
        lost = LostReplies(monkeypatch, head_write("raw"))
        sealed, spans = stream_spans(lc, record, [record.last_ledger], b"", recover_dangling=True)
        assert lost.lost and sealed.last_ledger.last_offset == 2 and spans[0].last_offset == 2
        assert streams.read_stream(lc.store, "raw").value.last_ledger.last_offset == 2


def test_a_retention_change_whose_reply_is_lost_is_read_back(store, monkeypatch):
    streams.create_stream(store, StreamRecord("raw", "raw"))
    lost = LostReplies(monkeypatch, head_write("raw"))
    stored = set_retention(store, "raw", max_age=3600)
    assert lost.lost and stored.retention.max_age == 3600
    assert streams.read_stream(store, "raw").value.retention.max_age == 3600


def test_a_stream_creation_whose_reply_is_lost_is_read_back(store, monkeypatch):
    lost = LostReplies(monkeypatch, head_write("events", "Create"))
    created = ensure_stream(store, "events")
    assert lost.lost and created.name == "events" and created.format == "arrow"
    assert streams.read_stream(store, "events").value == created


def test_a_transform_that_loses_a_reply_after_the_heads_write_lost_its_own_is_an_unknown_outcome(store, monkeypatch):
    """The head's write lands and its reply is lost; the update reads the head back and runs the transform again,
    whose own read then gets no reply either (ZooKeeper flapping). Whether the first write landed is unknown: rule 16
    says so (UpdateOutcomeUnknownError), not a plain failure, which a caller takes for "nothing written" (review
    2026-11-29: the transform's errors were all raised as they are)."""
    import pytest
    from kazoo.exceptions import ConnectionLoss

    from metadata.errors import MetadataError
    from metadata.streams import UpdateOutcomeUnknownError

    streams.update_stream(store, "raw", lambda record: record, create=StreamRecord("raw", "raw"))
    calls = []

    def transform(record: StreamRecord) -> StreamRecord:
        calls.append(record)
        if len(calls) > 1:   # the re-run after the lost reply: its own read gets none
            raise MetadataError("ZooKeeper request failed: ConnectionLoss (a test's)") from ConnectionLoss()
        return record.replace(owner="someone")

    LostReplies(monkeypatch, head_write("raw"))
    with pytest.raises(UpdateOutcomeUnknownError):
        streams.update_stream(store, "raw", transform, read_back=True)
    assert len(calls) == 2
