"""Bad options fail with errors that say what is wrong, and write nothing."""
import pytest
from pyspark.sql import functions as F

from metadata.store import MetadataStore
from metadata.streams import find_stream
from tests.spark.helpers import read, stream_ledgers, write


def small(spark):
    return spark.range(0, 100, numPartitions=2).select("id")


def nothing_written(uri, stream):
    with MetadataStore(uri) as store:
        return find_stream(store, stream) is None and not stream_ledgers(uri, stream)


def test_unknown_stream(spark, shared_uri, stream):
    with pytest.raises(Exception, match=f"stream '{stream}' does not exist"):
        read(spark, shared_uri, stream).count()


@pytest.mark.parametrize("options, message", [
    ({"ensembleSize": 2, "writeQuorum": 3}, "ensembleSize >= writeQuorum >= ackQuorum"),
    ({"compression": "gzip"}, "compression='gzip': allowed values are none, lz4, zstd"),
    ({"entryBytes": "big"}, "entryBytes='big': allowed values are integers"),
    ({"ensembleSzie": 3}, "unknown option"),
])
def test_bad_write_options_write_nothing(spark, shared_uri, stream, options, message):
    with pytest.raises(Exception, match=message):
        write(small(spark), shared_uri, stream, **options)
    assert nothing_written(shared_uri, stream)


def test_not_enough_nodes_writes_nothing(spark, shared_uri, stream):
    with pytest.raises(Exception, match="ensembleSize=5 but only 3 writable storage nodes"):
        write(small(spark), shared_uri, stream, ensembleSize=5, writeQuorum=3)
    assert nothing_written(shared_uri, stream)


def test_wrong_password(spark, shared_uri, stream):
    write(small(spark), shared_uri, stream, password="right")
    before = stream_ledgers(shared_uri, stream)
    with pytest.raises(Exception, match=f"wrong password for stream .{stream}."):
        write(small(spark), shared_uri, stream, password="wrong")
    with pytest.raises(Exception, match="wrong password for ledger"):
        read(spark, shared_uri, stream, password="wrong").count()
    assert stream_ledgers(shared_uri, stream) == before
    assert read(spark, shared_uri, stream, password="right").count() == 100


def test_incompatible_append_fails_before_writing(spark, shared_uri, stream):
    write(small(spark), shared_uri, stream)
    before = stream_ledgers(shared_uri, stream)
    with pytest.raises(Exception, match=r"cannot append to stream .*struct<id:bigint>.*struct<id:string>.*"
                                        r"to match, or replace the stream's rows with mode\(\"overwrite\"\)"):
        write(small(spark).select(F.col("id").cast("string").alias("id")), shared_uri, stream)
    assert stream_ledgers(shared_uri, stream) == before


def test_incompatible_streaming_append_does_not_suggest_overwrite(spark, shared_uri, stream, tmp_path):
    """Issue 16: a streaming sink only appends, so its schema mismatch must not suggest mode("overwrite")."""
    write(small(spark), shared_uri, stream)
    before = stream_ledgers(shared_uri, stream)
    query = (spark.readStream.format("rate").option("rowsPerSecond", "10").load()
             .select(F.col("value").cast("string").alias("id")).writeStream.format("ledger")
             .option("metadata", shared_uri).option("checkpointLocation", str(tmp_path / "checkpoint"))
             .start(stream))
    try:
        with pytest.raises(Exception) as failed:
            query.processAllAvailable()
    finally:
        query.stop()
    message = next(line for line in str(failed.value).splitlines() if "cannot append to stream" in line)
    assert "write the query to a new stream" in message and "mode(" not in message, message
    assert stream_ledgers(shared_uri, stream) == before


def test_bad_read_options(spark, shared_uri, stream):
    write(small(spark), shared_uri, stream)
    # `latest` is a streaming start (spark.readStream); a batch read rejects it.
    with pytest.raises(Exception, match="startingOffsets='latest'"):
        read(spark, shared_uri, stream, startingOffsets="latest").count()
    with pytest.raises(Exception, match="nothing to read"):
        read(spark, shared_uri, None).count()
    with pytest.raises(Exception, match="ledger 987654321 does not exist"):
        read(spark, shared_uri, None, ledgers="987654321").count()
