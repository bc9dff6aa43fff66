"""connector/spark/stream_options.py: the sink's query id is the one in <checkpointLocation>/metadata, read where
Hadoop's local file system would read it; any other location is refused, never replaced by a made-up id."""
import json

import pytest

from connector.spark.errors import InvalidOptionError
from connector.spark.stream_options import StreamOptions, local_path


def sink_options(location):
    return StreamOptions.parse({"metadata": "zk://127.0.0.1:2181/ledgers", "path": "events",
                                "checkpointlocation": location})[1]


def checkpoint(directory, query_id):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "metadata").write_text(json.dumps({"id": query_id}) + "\n")


@pytest.mark.parametrize("form", ["{}", "file:{}", "file://{}"])
def test_local_forms_read_the_id_spark_wrote(tmp_path, form):
    checkpoint(tmp_path / "ck", "5f0e0a52-aaaa-bbbb-cccc-000000000001")
    assert sink_options(form.format(tmp_path / "ck")).query_id() == "query-5f0e0a52-aaaa-bbbb-cccc-000000000001"


def test_a_wiped_checkpoint_on_the_same_location_gives_the_new_query_its_own_id(tmp_path):
    location = f"file://{tmp_path}/ck"
    checkpoint(tmp_path / "ck", "old-query")
    before = sink_options(location).query_id()
    checkpoint(tmp_path / "ck", "new-query")   # Spark writes a new id into a wiped checkpoint
    assert sink_options(location).query_id() != before


@pytest.mark.parametrize("location", ["hdfs://namenode:8020/ck/events", "s3a://bucket/ck", "abfss://c@a.dfs.core/ck",
                                      "file://otherhost/ck"])
def test_a_location_python_cannot_read_is_refused_with_what_to_do(location):
    with pytest.raises(InvalidOptionError, match="option checkpointLocation") as raised:
        sink_options(location).query_id()
    assert location in str(raised.value) and "local path or a file: URI" in str(raised.value)


def test_a_checkpoint_without_spark_metadata_is_refused(tmp_path):
    with pytest.raises(InvalidOptionError, match=f"cannot read the query id Spark keeps in {tmp_path}/metadata"):
        sink_options(str(tmp_path)).query_id()


def test_local_path_takes_what_hadoop_resolves_locally():
    assert local_path("/ck/q") == "/ck/q"
    assert local_path("ck/q:1") == "ck/q:1"          # a colon after a slash is no scheme
    assert local_path("file:/ck/a%20b") == "/ck/a%20b"   # read literally, as Hadoop does
    assert local_path("file:///ck") == "///ck"
    assert local_path("file://host/ck") is None
    assert local_path("viewfs://cluster/ck") is None


def stream_options(**options):
    return StreamOptions.parse({"metadata": "zk://127.0.0.1:2181/ledgers", "path": "events", **options})[1]


@pytest.mark.parametrize("value", ["-1", "newest", "1.5"])
def test_a_bad_starting_offset_of_a_streaming_read_is_told_latest_is_allowed_too(value):
    with pytest.raises(InvalidOptionError, match=f"option startingOffsets='{value}': allowed values are earliest, "
                                                 "latest or a non-negative stream offset"):
        stream_options(startingOffsets=value)
    starts = [stream_options(startingOffsets=v).starting for v in ("LATEST", "earliest", "7")]
    assert starts == ["latest", "earliest", 7]


def test_a_misspelt_streaming_option_is_answered_with_the_streaming_options_too():
    with pytest.raises(InvalidOptionError) as refused:
        stream_options(maxOffsetPerTrigger="5")
    known = str(refused.value).split("knows ", 1)[1].split(", ")
    assert str(refused.value).startswith("unknown option(s) maxoffsetpertrigger;")
    assert {"maxOffsetsPerTrigger", "maxRecordsPerTrigger", "checkpointLocation", "entryBytes"} <= set(known)
