"""A batch query's driver-side steps share one LedgerClient per Python worker (connector/spark/task_client.py).

Spark runs each step of a query in a pooled Python worker: finding the schema (schema()), planning the read
(reader() and partitions()), preparing a write (writer()), committing or aborting it; here this process is that
worker, query after query. Each ZooKeeper session the connector opens is a MetadataStore (a LedgerClient holds
one): a session of their own cost a read three before its first task, and a write two.
"""
from __future__ import annotations

import pytest
from pyspark.sql.types import LongType, StructField, StructType

from connector.client import LedgerClient, Streams
from connector.client.errors import NotEnoughNodesError
from connector.spark.planning import pieces_of
from connector.spark import LedgerDataSource
from connector.spark.schema import raw_read_schema
from metadata import layout
from metadata import store as metadata_store
from metadata.store import MetadataStore

SCHEMA = StructType([StructField("x", LongType())])


@pytest.fixture
def sessions(monkeypatch) -> list[str]:
    """The URIs of the ZooKeeper sessions opened from here on."""
    opened: list[str] = []
    real = metadata_store.MetadataStore.__init__

    def counted(self, uri, *args, **kwargs):
        opened.append(uri)
        real(self, uri, *args, **kwargs)
    monkeypatch.setattr(metadata_store.MetadataStore, "__init__", counted)
    return opened


def test_query_after_query_the_schema_and_the_plan_use_one_session(metadata_uri, cluster, sessions):
    cluster(3)
    with LedgerClient(metadata_uri) as lc, Streams(lc).open_writer("events", max_ledger_entries=2) as sw:
        for n in range(6):
            sw.append(b"entry %d" % n)

    def query() -> None:
        source = LedgerDataSource({"metadata": metadata_uri, "path": "events"})
        reader = source.reader(source.schema())
        pieces = [piece for p in reader.partitions() for piece in pieces_of(p)]
        assert sum(p.last_entry - p.first_entry + 1 for p in pieces) == 6

    query()                  # opens the shared client
    before = len(sessions)
    for _ in range(4):
        query()
    assert len(sessions) == before   # a session per step made 12


def test_write_after_write_the_prepare_and_commit_use_one_session(metadata_uri, cluster, sessions):
    cluster(3)
    source = LedgerDataSource({"metadata": metadata_uri, "path": "events"})
    source.writer(SCHEMA, False).commit([])   # opens the shared client (and this driver's registration)
    before = len(sessions)
    for _ in range(4):
        source.writer(SCHEMA, False).commit([])
    assert len(sessions) == before   # a session per step made 8


def test_a_failed_step_gives_the_client_up(metadata_uri, cluster, sessions):
    cluster(3)
    source = LedgerDataSource({"metadata": metadata_uri, "path": "events"})
    source.writer(SCHEMA, False).commit([])
    before = len(sessions)
    with pytest.raises(NotEnoughNodesError):   # inside the step: it had the shared client
        LedgerDataSource({"metadata": metadata_uri, "path": "events", "ensembleSize": "9"}).writer(SCHEMA, False)
    source.writer(SCHEMA, False).commit([])
    assert len(sessions) - before == 1   # the failure's client is closed; the next step opens a new one


def test_a_streaming_source_keeps_one_client_of_its_own(metadata_uri, cluster):
    """A streaming source runs in a Python process of its own for as long as its query runs, with a client of its
    own (stream_read.py): finding the stream's format and a startingTimestamp's offset take that client or a
    one-off session, so no shared client stays open beside it, idle."""
    cluster(3)
    with LedgerClient(metadata_uri) as lc, Streams(lc).open_writer("events") as sw:
        for n in range(3):
            sw.append(b"entry %d" % n)
    with MetadataStore(metadata_uri) as store:
        before = set(store.children(layout.WRITERS))
        source = LedgerDataSource({"metadata": metadata_uri, "path": "events", "startingTimestamp": "0"})
        reader = source.streamReader(raw_read_schema(False))   # schema() runs in a planning worker of its own
        assert reader.initialOffset() is not None
        assert len(set(store.children(layout.WRITERS)) - before) == 1   # the source's own client
        reader.stop()
