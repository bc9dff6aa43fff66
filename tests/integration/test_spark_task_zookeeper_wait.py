"""A Spark task that starts while ZooKeeper is away waits for it, as every other metadata call does
($LEDGER_ZK_WAIT_SECONDS, 60 s by default), instead of failing after a client's 15 s connect timeout.

Found by `ledger soak --spark` (seed 21): ZooKeeper restarted during a micro-batch (13-17 s away, with its JVM's
start), the batch's write tasks failed with "cannot reach ZooKeeper ... within 15s", and the query died. Here
an executor's write task and read task (run as an executor runs them, with a real ZooKeeper stopped for longer
than 15 s and real storage nodes) complete once ZooKeeper is back.
"""
from __future__ import annotations

import time

from connector.spark.datasource import read_schema
from connector.spark.read import LedgerReader
from connector.spark.write import LedgerWriter
from metadata.store import MetadataStore
from metadata.streams import read_stream
from tests.harness.poll import poll_until
from tests.integration.test_zookeeper_outage import (  # noqa: F401 - fixtures
    BACK_WITHIN, SCHEMA, STREAM, cluster, in_thread, outage_of, spark_options, stream_ids, write_tasks,
)

AWAY_SECONDS = 18.0   # longer than LedgerClient's 15 s connect timeout


def test_write_and_read_tasks_started_while_zookeeper_is_away_wait_for_it(cluster, outage_of):
    cluster.start_nodes(3)
    writer = LedgerWriter.prepare(spark_options(cluster.uri), SCHEMA, overwrite=False)

    outage = outage_of("stop", AWAY_SECONDS)
    outage.begin()
    task = in_thread(write_tasks, writer, cluster.uri, range(0, 100))
    poll_until(lambda: outage.remaining() <= 0, AWAY_SECONDS + 5, interval=0.2, what="the outage to pass 15 s")
    assert not task.done(), task.exception()
    outage.end()
    writer.commit(task.result(timeout=BACK_WITHIN))
    assert stream_ids(cluster.uri) == list(range(100))

    with MetadataStore(cluster.uri) as store:
        schema = read_schema(read_stream(store, STREAM).value, include_metadata=False)
    reader = LedgerReader(spark_options(cluster.uri), schema, raw=False)
    (partition,) = reader.partitions()
    outage = outage_of("stop", AWAY_SECONDS)
    outage.begin()
    began = time.monotonic()
    read = in_thread(lambda: [row for batch in reader.read(partition) for row in batch.column(0).to_pylist()])
    poll_until(lambda: outage.remaining() <= 0, AWAY_SECONDS + 5, interval=0.2, what="the outage to pass 15 s")
    assert not read.done(), read.exception()
    outage.end()
    assert read.result(timeout=BACK_WITHIN) == list(range(100))
    assert time.monotonic() - began >= AWAY_SECONDS
