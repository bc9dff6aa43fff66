"""The metadata view's reader (option("view", "ledgers")) against a cluster whose streams change while it reads.
Run in this process rather than through Spark, so that a stream can be deleted between its listing and its read."""
import pytest

from connector.client import LedgerClient, Streams
from connector.spark import view
from connector.spark.options import LedgerOptions
from metadata.errors import NoSuchStreamError


@pytest.fixture
def client(cluster, metadata_uri):
    cluster(3)
    with LedgerClient(metadata_uri) as c:
        yield c


def test_a_stream_deleted_while_the_view_lists_the_clusters_streams_is_skipped(client, metadata_uri, monkeypatch):
    """A stream deleted after the view listed the cluster's streams (a scratch stream dropped while a notebook
    explores) failed the whole view with NoSuchStreamError. It is not one to show: its rows are left out, and
    every other stream's ledgers still name their stream."""
    with Streams(client).open_writer("kept", max_ledger_entries=2) as writer:
        for i in range(5):
            writer.append(f"e{i}".encode())
    listed = view.list_streams
    monkeypatch.setattr(view, "list_streams", lambda store: ["dropped", *listed(store)])   # listed, then deleted
    rows = list(view.LedgerViewReader(LedgerOptions.parse({"view": "ledgers", "metadata": metadata_uri})).read(None))
    assert [(row[1], row[8], row[9]) for row in rows] == [("kept", 0, 1), ("kept", 2, 3), ("kept", 4, 4)]


def test_the_view_of_one_stream_that_does_not_exist_names_it(client, metadata_uri):
    with pytest.raises(NoSuchStreamError, match="dropped"):
        list(view.LedgerViewReader(LedgerOptions.parse(
            {"view": "ledgers", "metadata": metadata_uri, "path": "dropped"})).read(None))
