"""Streaming source admission (issue 16 item 2), Kafka's semantics: minOffsetsPerTrigger holds a micro-batch back
until enough new offsets are there, unless maxTriggerDelay has passed since the last batch was planned;
maxOffsetsPerTrigger is Kafka's name for maxRecordsPerTrigger. Real SparkSession and cluster; the rule 17 side
(a held-back batch announces the previous end, never less) on the source itself."""
import datetime
import time

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMinRows

from connector.client import LedgerClient, Streams
from connector.spark.errors import InvalidOptionError
from connector.spark.schema import raw_read_schema
from connector.spark.stream_options import StreamOptions
from connector.spark.stream_read import LedgerStreamReader
from tests.harness.poll import poll_until
from tests.harness.stream_fixtures import without_created


def stream_query(spark, uri, stream, table, **options):
    reader = spark.readStream.format("ledger").option("metadata", uri)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(stream).writeStream.format("memory").queryName(table)


def append(uri, stream, first, count):
    """Entries e<first>..e<first+count-1>, sealed (the writer closes) so that every reader sees them at once."""
    with LedgerClient(uri) as lc, Streams(lc).open_writer(stream) as writer:
        for i in range(first, first + count):
            writer.append(f"e{i:03d}".encode())


def batches(query) -> list[dict]:
    return [p for p in query.recentProgress if p["numInputRows"]]


def rows(spark, table) -> int:
    return spark.sql(f"select count(*) from {table}").collect()[0][0]


def started(progress: dict) -> float:
    return datetime.datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()


def test_min_offsets_hold_a_batch_back_until_enough_rows_are_there(spark, shared_uri, stream):
    append(shared_uri, stream, 0, 5)
    query = stream_query(spark, shared_uri, stream, "held", minOffsetsPerTrigger="20", maxTriggerDelay="1h").trigger(
        processingTime="200 milliseconds").start()
    try:
        # The first batch after the query starts is not held back (as in Kafka: no batch was planned yet).
        poll_until(lambda: [p["numInputRows"] for p in batches(query)] == [5], 120, what="the first batch")
        append(shared_uri, stream, 5, 10)
        deadline = time.monotonic() + 5   # 25 triggers: 10 new offsets stay below 20
        while time.monotonic() < deadline:
            assert rows(spark, "held") == 5 and len(batches(query)) == 1
            time.sleep(0.2)
        append(shared_uri, stream, 15, 10)
        poll_until(lambda: [p["numInputRows"] for p in batches(query)] == [5, 20], 120, what="the 20 held rows")
        assert rows(spark, "held") == 25
    finally:
        query.stop()


def test_max_trigger_delay_releases_a_small_batch(spark, shared_uri, stream):
    append(shared_uri, stream, 0, 5)
    query = stream_query(spark, shared_uri, stream, "delayed", minOffsetsPerTrigger="1000",
                         maxTriggerDelay="3s").trigger(processingTime="200 milliseconds").start()
    try:
        poll_until(lambda: len(batches(query)) == 1, 120, what="the first batch")
        append(shared_uri, stream, 5, 3)
        poll_until(lambda: len(batches(query)) == 2, 120, what="the small batch the delay lets through")
        first, second = batches(query)
        assert (first["numInputRows"], second["numInputRows"]) == (5, 3)
        # planned once 3 s had passed since the first batch was planned (during its trigger)
        assert started(second) - started(first) >= 2.9, (first["timestamp"], second["timestamp"])
    finally:
        query.stop()


def test_max_offsets_per_trigger_is_kafkas_name_and_available_now_reads_all_without_admission(
        spark, shared_uri, stream):
    append(shared_uri, stream, 0, 10)
    query = stream_query(spark, shared_uri, stream, "kafka_names", maxOffsetsPerTrigger="4", maxRecordsPerTrigger="4",
                         minOffsetsPerTrigger="100").trigger(availableNow=True).start()
    assert query.awaitTermination(120)   # AvailableNow must end: minOffsetsPerTrigger does not hold it
    assert [p["numInputRows"] for p in batches(query)] == [4, 4, 2]


def test_conflicting_and_malformed_admission_options_are_refused_clearly(spark, shared_uri, stream):
    append(shared_uri, stream, 0, 1)
    with pytest.raises(Exception, match="maxRecordsPerTrigger=4 and maxOffsetsPerTrigger=5 disagree"):
        stream_query(spark, shared_uri, stream, "conflict", maxRecordsPerTrigger="4",
                     maxOffsetsPerTrigger="5").start().awaitTermination(60)
    base = {"metadata": shared_uri, "path": stream}
    for options, message in (
        ({"maxTriggerDelay": "30s"}, "minOffsetsPerTrigger is not set"),
        ({"minOffsetsPerTrigger": "10", "maxTriggerDelay": "5 minutes"}, "an integer with a unit"),
        ({"minOffsetsPerTrigger": "0"}, "minOffsetsPerTrigger='0': allowed values are integers >= 1"),
        ({"maxOffsetsPerTrigger": "-1"}, "maxOffsetsPerTrigger='-1'"),
    ):
        with pytest.raises(InvalidOptionError, match=message):
            StreamOptions.parse({**base, **options})
    parsed = {delay: StreamOptions.parse({**base, "minOffsetsPerTrigger": "1", "maxTriggerDelay": delay})[1]
              for delay in ("30s", "5m", "1h", "250", "500ms", "2min")}
    assert {delay: p.max_trigger_delay for delay, p in parsed.items()} == {
        "30s": 30, "5m": 300, "1h": 3600, "250": 0.25, "500ms": 0.5, "2min": 120}
    assert StreamOptions.parse({**base, "minOffsetsPerTrigger": "1"})[1].max_trigger_delay == 900   # Kafka's 15m


def test_a_held_back_batch_announces_the_previous_end_never_less(shared_uri, stream):
    """Rule 17: latestOffset's end is the planned batch's end; holding a batch back announces the last one again."""
    append(shared_uri, stream, 0, 5)
    options, stream_options = StreamOptions.parse({"metadata": shared_uri, "path": stream,
                                                   "minOffsetsPerTrigger": "10", "maxTriggerDelay": "5s"})
    reader = LedgerStreamReader(options, stream_options, raw_read_schema(include_metadata=True), raw=True)
    limit = reader.getDefaultReadLimit()
    assert limit == ReadMinRows(10)
    start = reader.initialOffset()
    assert without_created(start) == {"offset": 0, "stream": stream}
    first = reader.latestOffset(start, limit)
    planned_at = time.monotonic()
    assert without_created(first) == {"offset": 5, "stream": stream}   # no batch planned yet: not held back
    append(shared_uri, stream, 5, 3)
    held = reader.latestOffset(first, limit)
    if time.monotonic() - planned_at < 5:
        assert held == first and reader.partitions(first, held) == []
    offset = reader.latestOffset({"offset": 5}, ReadAllAvailable())  # Trigger.Once
    assert without_created(offset) == {"offset": 8, "stream": stream}
    def released_batch():
        end = reader.latestOffset(first, limit)
        return end if end != first else None

    released = poll_until(released_batch, 60, interval=0.2, what="maxTriggerDelay=5s to release the 3 new offsets")
    assert time.monotonic() - planned_at >= 5 and without_created(released) == {"offset": 8, "stream": stream}
    assert [(p.lo, p.hi) for p in reader.partitions(first, released)] == [(5, 7)]
    with pytest.raises(InvalidOptionError, match="its checkpoint holds offsets of stream 'other'"):
        reader.latestOffset({"offset": 5, "stream": "other"}, limit)
