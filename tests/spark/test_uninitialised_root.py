"""Spark reads, writes and streaming writes pointed at a metadata root nobody initialised fail with the store's
message (the root, and `ledger init --metadata URI`) and create nothing (issue 16 item 6)."""
from __future__ import annotations

import re

import pytest
from kazoo.client import KazooClient

from metadata.store import MetadataUri
from tests.spark.helpers import read, write


@pytest.fixture
def root_absent(zookeeper, fresh_root):
    client = KazooClient(hosts=zookeeper.address)
    client.start(timeout=15)
    yield lambda: client.exists(MetadataUri.parse(fresh_root).root) is None
    client.stop()
    client.close()


def test_spark_on_an_uninitialised_root_names_it_and_creates_nothing(spark, fresh_root, root_absent, stream, tmp_path):
    says = re.escape(f"run `ledger init --metadata {fresh_root}` to initialise it")
    with pytest.raises(Exception, match=says):
        read(spark, fresh_root, stream).count()
    with pytest.raises(Exception, match=says):
        write(spark.range(0, 10).select("id"), fresh_root, stream)
    rate = spark.readStream.format("rate").option("rowsPerSecond", 10).load()
    queries = []
    try:
        with pytest.raises(Exception, match=says):
            queries.append(rate.writeStream.format("ledger").option("metadata", fresh_root)
                           .option("checkpointLocation", str(tmp_path / "checkpoint")).start(stream))
            queries[0].processAllAvailable()
    finally:
        for query in queries:
            query.stop()
    assert root_absent()
