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
