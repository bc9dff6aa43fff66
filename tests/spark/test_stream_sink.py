"""The exactly-once streaming sink: replays, a query killed before its commit, a commit that raises."""
import json
import os
import signal
import subprocess
import sys

import pytest
from chispa import assert_df_equality

from connector.client import LedgerClient
from connector.spark.recovery import STREAM_TAG
from metadata.model import LedgerState
from connector.spark.commit import with_open_ledger
from metadata.streams import find_stream, iter_ledgers, update_stream
from tests.harness.poll import poll_until
from tests.spark.stream_sink_job import start_query


def write_input(directory, name, ids):
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / name, "w") as f:
        for i in ids:
            f.write(json.dumps({"id": i, "value": f"v{i}"}) + "\n")


def run_query(spark, uri, stream, input_dir, checkpoint, hold_file=""):
    """A run of the query in this test's SparkSession; returns once it stopped."""
    query = start_query(spark, uri, stream, input_dir, checkpoint, hold_file)
    try:
        query.awaitTermination(300)
    finally:
        query.stop()
    if query.exception() is not None:
        raise AssertionError(str(query.exception()))


def start_job(uri, stream, input_dir, checkpoint, hold_file=""):
    """A run of the query in a driver process of its own, which a test can kill."""
    command = [sys.executable, "-m", "tests.spark.stream_sink_job", uri, stream, str(input_dir), str(checkpoint)]
    if hold_file:
        command.append(str(hold_file))
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def stream_rows(spark, uri, stream):
    return spark.read.format("ledger").option("metadata", uri).load(stream).select("id", "value")


def expected(spark, ids):
    return spark.createDataFrame([(i, f"v{i}") for i in ids], "id long, value string")


def ledgers_of(uri, stream):
    """(registered ledger ids, every ledger tagged with the stream) — they must end up equal."""
    with LedgerClient(uri) as lc:
        found = find_stream(lc.store, stream)
        registered = sorted(s.ledger_id for s in iter_ledgers(lc.store, found.value)) if found else []
        tagged = sorted(i for i in lc.list_ledgers() if lc.ledger_metadata(i).custom.get(STREAM_TAG) == stream)
    return registered, tagged


def test_a_batch_committed_again_after_restart_is_skipped(spark, shared_uri, stream, tmp_path):
    source, checkpoint = tmp_path / "in", tmp_path / "ck"
    write_input(source, "a.json", range(0, 50))
    run_query(spark, shared_uri, stream, source, checkpoint)
    # Spark re-runs a batch whose commit it did not record: make it do so for batch 0.
    for name in ("0", ".0.crc"):
        (checkpoint / "commits" / name).unlink()
    run_query(spark, shared_uri, stream, source, checkpoint)
    write_input(source, "b.json", range(50, 80))
    run_query(spark, shared_uri, stream, source, checkpoint)
    assert_df_equality(stream_rows(spark, shared_uri, stream), expected(spark, range(80)),
                       ignore_row_order=True, ignore_nullable=True)
    registered, tagged = ledgers_of(shared_uri, stream)
    assert registered == tagged


def test_query_killed_after_its_tasks_wrote_but_before_the_commit(spark, shared_uri, stream, tmp_path):
    source, checkpoint, hold = tmp_path / "in", tmp_path / "ck", tmp_path / "release"
    write_input(source, "a.json", range(0, 200))
    job = start_job(shared_uri, stream, source, checkpoint, hold_file=hold)
    try:
        with LedgerClient(shared_uri) as lc:
            others: set[int] = set()  # other streams' ledgers (tags never change): not read again

            def partition_zero_wrote():
                for ledger_id in set(lc.list_ledgers()) - others:
                    meta = lc.ledger_metadata(ledger_id)
                    if meta.custom.get(STREAM_TAG) == stream and meta.state is LedgerState.CLOSED:
                        return True
                    if meta.custom.get(STREAM_TAG) != stream:
                        others.add(ledger_id)
                return False
            poll_until(partition_zero_wrote, 180, what="partition 0's ledger to be written")
        assert ledgers_of(shared_uri, stream)[0] == []   # nothing committed yet
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
    # The restart, in another application (this test's): it finds the killed run's ledgers dangling.
    run_query(spark, shared_uri, stream, source, checkpoint)
    assert_df_equality(stream_rows(spark, shared_uri, stream), expected(spark, range(200)),
                       ignore_row_order=True, ignore_nullable=True)
    registered, tagged = ledgers_of(shared_uri, stream)
    assert registered == tagged   # the killed run's ledgers were recovered and deleted


def test_a_commit_that_raises_then_restart_leaves_no_duplicates(spark, shared_uri, stream, tmp_path):
    source, checkpoint, hold = tmp_path / "in", tmp_path / "ck", tmp_path / "release"
    write_input(source, "a.json", range(0, 50))
    run_query(spark, shared_uri, stream, source, checkpoint)
    write_input(source, "b.json", range(50, 100))
    query = start_query(spark, shared_uri, stream, source, checkpoint, hold_file=str(hold))
    owner = LedgerClient(shared_uri)
    try:
        poll_until(lambda: len((found := ledgers_of(shared_uri, stream))[1]) > len(found[0]),
                   180, what="the second batch's first task to write")
        # Another writer takes the stream's tail meanwhile: the batch's commit must refuse, not interleave.
        tail = owner.create_ledger(custom_metadata={STREAM_TAG: stream})
        update_stream(owner.store, stream, lambda r: with_open_ledger(r, tail.ledger_id))
        hold.touch()
        with pytest.raises(Exception, match="Writing job failed"):
            query.awaitTermination(300)
        # The refused commit registered nothing: the stream still holds the first batch only.
        assert stream_rows(spark, shared_uri, stream).count() == 50
    finally:
        hold.touch()
        query.stop()
        owner.close()   # the other writer goes away: its ledger is dangling and gets recovered
    run_query(spark, shared_uri, stream, source, checkpoint)
    assert_df_equality(stream_rows(spark, shared_uri, stream), expected(spark, range(100)),
                       ignore_row_order=True, ignore_nullable=True)
    registered, tagged = ledgers_of(shared_uri, stream)
    assert registered == tagged


def test_a_named_query_writes_to_the_sink(spark, shared_uri, stream, tmp_path):
    """Seen on main: `.queryName("orders")` failed the query with `unknown option(s) queryname`, because
    Spark hands the name to the sink among its options."""
    write_input(tmp_path / "in", "a.json", range(5))
    query = (spark.readStream.schema("id long, value string").json(str(tmp_path / "in"))
             .writeStream.format("ledger").queryName("orders").option("metadata", shared_uri)
             .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start(stream))
    try:
        assert query.name == "orders"
        query.awaitTermination(300)
    finally:
        query.stop()
    assert query.exception() is None, str(query.exception())
    assert_df_equality(stream_rows(spark, shared_uri, stream), expected(spark, range(5)), ignore_row_order=True,
                       ignore_nullable=True)
