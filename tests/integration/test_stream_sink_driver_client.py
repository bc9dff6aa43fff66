"""A streaming sink's driver-side steps share one LedgerClient per Python worker (connector/spark/task_client.py).

Spark asks the data source for a new stream writer for every micro-batch's commit (pyspark's
python_streaming_sink_runner calls streamWriter() and then commit() in a pooled Python worker); here this process
is that worker. Every LedgerClient registers a writer znode, and the writers folder's child version (cversion)
counts every registration made and ended: a client of their own for prepare and for commit made two and ended two
per batch.
"""
from __future__ import annotations

from pyspark.sql.types import LongType, StructField, StructType

from connector.spark import LedgerDataSource, task_client
from connector.spark.jobs import query_registry, start_query
from metadata import layout
from metadata.store import MetadataStore

SCHEMA = StructType([StructField("x", LongType())])


def registrations(store: MetadataStore) -> int:
    return store.zk.exists(layout.WRITERS).cversion


def test_batch_after_batch_the_sinks_prepare_and_commit_use_one_client(metadata_uri, cluster, tmp_path):
    cluster(3)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text('{"id": "sink-driver-client-test"}')
    source = LedgerDataSource({"metadata": metadata_uri, "path": "events", "checkpointLocation": str(checkpoint)})
    with MetadataStore(metadata_uri) as store:
        source.streamWriter(SCHEMA, False).commit([], 0)   # the query's start: the shared client and the driver's
        before = registrations(store)                      # registration are made
        for batch_id in range(1, 6):
            source.streamWriter(SCHEMA, False).commit([], batch_id)
        assert registrations(store) - before == 0
        task_client.close_shared()
        assert registrations(store) - before == 1          # the shared client's registration ends with it


def test_only_the_querys_start_looks_at_the_other_registries_of_the_cluster(metadata_uri, cluster, tmp_path,
                                                                           monkeypatch):
    """The janitor (jobs and queries on the stream whose driver is gone) reads every registry of the cluster; it
    runs at the query's start, not again at each batch's commit, for which Spark asks for a writer as well."""
    cluster(3)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text('{"id": "sink-janitor-test"}')
    with MetadataStore(metadata_uri) as store:
        for i in range(20):                                  # other queries of the cluster, with their drivers
            start_query(store, f"query-other-{i}", f"other-{i}", f"driver-{i}")
    others = [query_registry(f"query-other-{i}").path for i in range(20)]
    looked: list[str] = []
    for name in ("children", "read", "exists"):
        def counted(store, path, *args, _real=getattr(MetadataStore, name), **kwargs):
            looked.append(path)
            return _real(store, path, *args, **kwargs)
        monkeypatch.setattr(MetadataStore, name, counted)

    def registries_read() -> int:
        return sum(1 for path in looked if any(path.startswith(registry) for registry in others))

    source = LedgerDataSource({"metadata": metadata_uri, "path": "events", "checkpointLocation": str(checkpoint)})
    source.streamWriter(SCHEMA, False).commit([], 0)         # the query's start
    assert registries_read() >= 20
    looked.clear()
    for batch_id in range(1, 6):
        source.streamWriter(SCHEMA, False).commit([], batch_id)
    assert registries_read() == 0
