"""Issue 13 item 3: the exactly-once sink's query id is the one Spark keeps in its checkpoint, never one made up
from the checkpoint's location (a query restarted on a wiped checkpoint would have its batches discarded)."""
import shutil

import pytest
from chispa import assert_df_equality
from pyspark.errors import StreamingQueryException

from connector.client import LedgerClient
from metadata.query_commits import query_commits
from metadata.streams import find_stream
from tests.spark.stream_sink_job import start_query
from tests.spark.test_stream_sink import expected, run_query, stream_rows, write_input


def commits(uri, stream):
    with LedgerClient(uri) as lc:
        found = find_stream(lc.store, stream)
        return dict(query_commits(lc.store, found.value)) if found else {}


def test_a_query_restarted_on_a_wiped_checkpoint_gets_a_new_id_and_keeps_every_row(spark, shared_uri, stream,
                                                                                   tmp_path):
    location = f"file://{tmp_path}/ck"   # a URI, as Hadoop takes it; Python reads the same file
    write_input(tmp_path / "first", "a.json", range(0, 50))
    run_query(spark, shared_uri, stream, tmp_path / "first", location)
    shutil.rmtree(tmp_path / "ck")
    write_input(tmp_path / "second", "a.json", range(50, 80))
    run_query(spark, shared_uri, stream, tmp_path / "second", location)
    assert_df_equality(stream_rows(spark, shared_uri, stream), expected(spark, range(80)),
                       ignore_row_order=True, ignore_nullable=True)
    assert sorted(commits(shared_uri, stream).values()) == [0, 0]   # two queries, one batch each


@pytest.fixture
def hadoop_only_location(spark, tmp_path):
    """A checkpoint location only Hadoop can open: a viewfs mount of a local directory."""
    name = f"ck{abs(hash(str(tmp_path)))}"
    key = f"fs.viewfs.mounttable.{name}.link./ck"
    conf = spark._jsc.hadoopConfiguration()
    conf.set(key, f"file://{tmp_path}/viewfs-target")
    yield f"viewfs://{name}/ck/query"
    conf.unset(key)


def test_a_checkpoint_python_cannot_open_fails_the_query_and_commits_nothing(spark, shared_uri, stream, tmp_path,
                                                                            hadoop_only_location):
    write_input(tmp_path / "in", "a.json", range(0, 20))
    query = start_query(spark, shared_uri, stream, tmp_path / "in", hadoop_only_location)
    try:
        with pytest.raises(StreamingQueryException, match="option checkpointLocation") as raised:
            query.awaitTermination(300)
    finally:
        query.stop()
    assert hadoop_only_location in str(raised.value)
    assert (tmp_path / "viewfs-target" / "query" / "metadata").exists()   # Spark itself could use it
    assert commits(shared_uri, stream) == {}
