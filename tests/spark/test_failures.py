"""Failures during writes and reads: a failing task, a storage node killed mid-write, a crashed stream writer."""
import os
import signal
import subprocess
import sys
import threading

import pytest
from pyspark import TaskContext
from pyspark.sql import functions as F

from connector.client import LedgerClient
from connector.demo.sample import sample_dataframe
from metadata import registry
from metadata.store import MetadataStore
from metadata.streams import find_stream, read_stream
from tests.harness.poll import poll_until
from tests.spark.helpers import REPO, read, stream_ledgers, write


def fail_in_partition_1(batches):
    seen = 0
    for batch in batches:
        seen += batch.num_rows
        if TaskContext.get().partitionId() == 1 and seen > 1000:
            raise RuntimeError("boom: task fails mid-write")
        yield batch


def test_task_failing_mid_write_leaves_no_rows_and_no_ledgers(spark, shared_uri, stream):
    base = spark.range(0, 100, numPartitions=1).select("id")
    write(base, shared_uri, stream)
    committed = stream_ledgers(shared_uri, stream)
    failing = spark.range(0, 8000, numPartitions=2).select("id").mapInArrow(fail_in_partition_1, "id long")
    with pytest.raises(Exception, match="boom: task fails mid-write"):
        write(failing, shared_uri, stream, entryBytes=1024)
    assert read(spark, shared_uri, stream).count() == 100
    poll_until(lambda: stream_ledgers(shared_uri, stream) == committed, 30, what="the failed job's ledgers to go")


def gated(go_file):
    """Passes ten batches of each partition (Spark holds back the last one or two), then waits until
    go_file exists: the test's signal that it has killed a node."""
    def run(batches):
        import os as _os
        from tests.harness.poll import poll_until as _poll
        for index, batch in enumerate(batches):
            if index == 10:
                _poll(lambda: _os.path.exists(go_file), 120, what="the test's go signal")
            yield batch
    return run


def test_storage_node_killed_during_write(spark, cluster, metadata_uri, stream, tmp_path):
    nodes = {node.node_id: node for node in cluster(4)}
    go_file = str(tmp_path / "go")
    df = spark.range(0, 60000, numPartitions=2).select("id", F.sha2(F.col("id").cast("string"), 256).alias("h"))
    killed = []

    def kill_a_node_of_a_task_ledger():
        # The write itself runs on the main thread: Spark looks the data source up in the caller's session.
        try:
            poll_until(lambda: len(stream_ledgers(metadata_uri, stream)) == 2, 120, what="both task ledgers")
            ledger = stream_ledgers(metadata_uri, stream)[0]
            with LedgerClient(metadata_uri) as lc:
                victim = lc.ledger_metadata(ledger).fragments[0].ensemble[0]
            nodes[victim].kill()
            killed.append((victim, ledger))
        finally:
            open(go_file, "w").close()

    killer = threading.Thread(target=kill_a_node_of_a_task_ledger)
    killer.start()
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
    try:
        write(df.mapInArrow(gated(go_file), df.schema), metadata_uri, stream, entryBytes=4096)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
        killer.join(150)
    assert killed, "no node was killed while the write was running"
    back = read(spark, metadata_uri, stream)
    assert back.count() == 60000 and back.agg(F.sum("id")).collect()[0][0] == sum(range(60000))
    victim, ledger = killed[0]
    assert ledger in stream_ledgers(metadata_uri, stream)
    with LedgerClient(metadata_uri) as lc:
        fragments = lc.ledger_metadata(ledger).fragments
    # The writer replaced the killed node: in a new fragment, or in place of the first one (rule 3,
    # with_ensemble_from) if the kill came before the ledger's first entry was acknowledged.
    assert victim not in fragments[-1].ensemble, fragments


def test_dangling_last_ledger_is_recovered_on_read(spark, shared_uri, stream):
    write(sample_dataframe(spark, 2000), shared_uri, stream)
    crashed = subprocess.Popen(
        [sys.executable, "-m", "connector.demo.dangling", "--metadata", shared_uri, "--stream", stream,
         "--rows", "3000", "--entry-bytes", "16384"],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )
    try:
        line = crashed.stdout.readline().split()
    finally:
        os.kill(crashed.pid, signal.SIGKILL)
        crashed.wait(30)
    assert line[0] == "acknowledged", line
    ledger_id, rows = int(line[1]), int(line[2])
    with MetadataStore(shared_uri) as store, LedgerClient(shared_uri) as lc:
        writer_id = lc.ledger_metadata(ledger_id).writer_id
        poll_until(lambda: not registry.writer_alive(store, writer_id), 60, what="the crashed writer's session to expire")
        assert read_stream(store, stream).value.last_ledger.last_offset is None
    back = read(spark, shared_uri, stream, includeMetadata="true")
    assert back.count() == 2000 + rows
    assert back.filter("_offset != id").count() == 0
    assert back.select("id").distinct().count() == 2000 + rows
    with MetadataStore(shared_uri) as store, LedgerClient(shared_uri) as lc:
        assert lc.ledger_metadata(ledger_id).is_closed
        assert read_stream(store, stream).value.last_ledger.last_offset == 2000 + rows - 1
        assert find_stream(store, stream) is not None
