"""Time in the Spark connector (issue 16 item 1), with a real SparkSession and cluster: `_timestamp` among the
includeMetadata columns, startingTimestamp/endingTimestamp for batch reads, startingTimestamp for streaming
queries, startingOffsetsByTimestampStrategy error|latest, pruning of partitions by _timestamp filters when
spark.sql.python.filterPushdown.enabled is on (the session's conftest sets it), and ledgers written before entry
times existed. DataFrames are compared with chispa.

Spark writes take their times from the executors' clock: a test marks a time between two writes (the
millisecond after the first one finished, waited for before the second starts), so every row of the first is
before the mark and every row of the second at or after it. Raw streams are written by stream writers whose
clock the test scripts, so their times are exact.
"""
import datetime
import time

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.errors import AnalysisException, StreamingQueryException
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, LongType, StructField, StructType, TimestampType

from connector.client import LedgerClient, Streams
from connector.client.entry_time import AppendClock
from connector.spark.encoding import EntryBuilder, entries_of, entry_header
from connector.spark.row_index import ROW_INDEX_KEY, RowIndexBuilder
from connector.spark.schema import decode_schema
from metadata import streams
from metadata.model import StreamLedger
from tests.harness.poll import poll_until
from tests.spark.helpers import planned, read, write

BASE = 1_700_000_000_000


def utc(ms: int) -> datetime.datetime:
    """A _timestamp as collected (the session's time zone is UTC: naive datetimes in UTC)."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).replace(tzinfo=None)


def scripted_clock(times_ms):
    readings = iter(times_ms)
    last = [0]

    def now():
        last[0] = next(readings, last[0])
        return last[0] / 1000
    return AppendClock(now=now)


def raw_stream(uri, stream, times, per_ledger=3):
    """A raw stream written by a stream writer whose entry n is appended at times[n]."""
    with LedgerClient(uri) as lc, Streams(lc).open_writer(stream, max_ledger_entries=per_ledger,
                                                        clock=scripted_clock(times)) as writer:
        for n in range(len(times)):
            writer.append(f"e{n}".encode())


def mark_after_write() -> int:
    """A time after every row written so far, and before every row written from now on."""
    mark = int(time.time() * 1000) + 1
    poll_until(lambda: int(time.time() * 1000) > mark, 5, interval=0.001, what="the clock to pass the mark")
    return mark


def batches_with_marks(spark, uri, stream, batches=3, rows=10):
    """batches Spark writes of ids [b*rows, (b+1)*rows), one ledger each; the marks between them."""
    marks = []
    for b in range(batches):
        write(spark.range(b * rows, (b + 1) * rows, numPartitions=1), uri, stream)
        marks.append(mark_after_write())
    return marks


def ids(df) -> list[int]:
    return sorted(r.id for r in df.select("id").collect())


def test_includemetadata_gives_each_raw_entry_its_writers_append_time(spark, shared_uri, stream):
    times = [BASE + 5, BASE + 5, BASE + 7, BASE + 7, BASE + 9]   # equal times across a ledger boundary
    raw_stream(shared_uri, stream, times, per_ledger=2)
    df = read(spark, shared_uri, stream, includeMetadata="true")
    assert df.schema["_timestamp"].dataType == TimestampType() and df.schema["_timestamp"].nullable
    expected = spark.createDataFrame(
        [(f"e{n}".encode(), n, utc(t)) for n, t in enumerate(times)],
        StructType([StructField("payload", BinaryType(), False), StructField("_offset", LongType(), True),
                    StructField("_timestamp", TimestampType(), True)]))
    assert_df_equality(df.select("payload", "_offset", "_timestamp").orderBy("_offset"), expected)


def test_spark_rows_carry_the_time_their_entry_was_appended_one_time_per_entry(spark, shared_uri, stream):
    before = int(time.time() * 1000)
    write(spark.range(0, 3000, numPartitions=2).withColumn("pad", F.lit("x" * 200)), shared_uri, stream,
          entryBytes=65536)
    after = int(time.time() * 1000)
    rows = read(spark, shared_uri, stream, includeMetadata="true").select("_ledger_id", "_entry_id", "_timestamp")
    per_entry = rows.groupBy("_ledger_id", "_entry_id").agg(F.countDistinct("_timestamp").alias("times"),
                                                             F.min("_timestamp").alias("at")).collect()
    assert len(per_entry) > 2 and all(r.times == 1 for r in per_entry)
    assert all(utc(before) <= r.at <= utc(after) for r in per_entry)
    for ledger in {r._ledger_id for r in per_entry}:   # each task's entries: never decreasing in entry order
        times = [r.at for r in sorted((r for r in per_entry if r._ledger_id == ledger), key=lambda r: r._entry_id)]
        assert times == sorted(times)


def test_batch_reads_between_starting_and_ending_timestamp(spark, shared_uri, stream):
    first, second, _ = batches_with_marks(spark, shared_uri, stream)
    full = read(spark, shared_uri, stream, includeMetadata="true")

    between = read(spark, shared_uri, stream, includeMetadata="true", startingTimestamp=first, endingTimestamp=second)
    assert_df_equality(between.orderBy("_offset"), full.filter(F.col("id").between(10, 19)).orderBy("_offset"))
    assert ids(read(spark, shared_uri, stream, startingTimestamp=second)) == list(range(20, 30))
    assert ids(read(spark, shared_uri, stream, endingTimestamp=first)) == list(range(0, 10))
    assert ids(read(spark, shared_uri, stream, startingTimestamp=0)) == list(range(0, 30))
    # no offset at or after endingTimestamp: to the end, as Kafka's
    assert ids(read(spark, shared_uri, stream, startingTimestamp=second, endingTimestamp=second + 10**9)) == \
        list(range(20, 30))
    assert read(spark, shared_uri, stream, startingTimestamp=first, endingTimestamp=first).count() == 0


def test_timestamps_find_offsets_inside_ledgers_of_a_raw_stream(spark, shared_uri, stream):
    times = [BASE + n // 2 * 10 for n in range(12)]   # pairs of equal times, ledgers of 3 entries
    raw_stream(shared_uri, stream, times)
    got = read(spark, shared_uri, stream, includeMetadata="true", startingTimestamp=BASE + 20, endingTimestamp=BASE + 41)
    assert sorted(r._offset for r in got.collect()) == [4, 5, 6, 7, 8, 9]


def test_a_starting_timestamp_after_every_row_fails_by_default_and_reads_nothing_with_latest(spark, shared_uri, stream):
    raw_stream(shared_uri, stream, [BASE, BASE + 1])
    with pytest.raises(AnalysisException, match="startingOffsetsByTimestampStrategy=latest") as failed:
        read(spark, shared_uri, stream, startingTimestamp=BASE + 2).collect()
    assert "has no offset whose append time is at or after startingTimestamp=1700000000002" in str(failed.value)
    assert read(spark, shared_uri, stream, startingTimestamp=BASE + 2, startingOffsetsByTimestampStrategy="latest"
                ).count() == 0


def test_timestamp_filters_give_the_right_rows_and_prune_where_spark_allows_it(spark, shared_uri, stream):
    assert spark.conf.get("spark.sql.python.filterPushdown.enabled") == "true"
    first, second, _ = batches_with_marks(spark, shared_uri, stream)
    # one partition per ledger (small ledgers are not packed), so that pruning shows in the partition count
    full = read(spark, shared_uri, stream, includeMetadata="true", maxPartitionBytes=0)
    assert full.rdd.getNumPartitions() == 3
    cases = [
        (F.col("_timestamp") >= F.lit(utc(second)), 1),
        (F.col("_timestamp") > F.lit(utc(first)), 2),
        (F.col("_timestamp") < F.lit(utc(first)), 1),
        (F.col("_timestamp").between(F.lit(utc(first)), F.lit(utc(second))), 1),
        (F.col("_timestamp") <= F.lit(utc(0)), 0),
    ]
    everything = spark.createDataFrame(full.collect(), full.schema)
    for condition, ledgers in cases:
        pruned = full.filter(condition)
        # Spark reads a placeholder partition when none is planned
        assert pruned.rdd.getNumPartitions() == max(planned(ledgers, 3), 1), condition
        assert_df_equality(pruned.orderBy("_offset"), everything.filter(condition).orderBy("_offset"))
    assert full.count() == everything.count()   # the DataFrame's own plan is whole after its filtered queries


def test_a_streaming_query_starts_at_starting_timestamp_and_reads_on(spark, shared_uri, stream):
    times = [BASE + 10 * n for n in range(10)]
    with LedgerClient(shared_uri) as lc, Streams(lc).open_writer(stream, max_ledger_entries=4,
                                                                clock=scripted_clock(times + [BASE + 500])) as writer:
        for n in range(10):
            writer.append(f"e{n}".encode())
        query = (spark.readStream.format("ledger").option("metadata", shared_uri).option("includeMetadata", "true")
                 .option("startingTimestamp", str(BASE + 65)).load(stream)
                 .writeStream.format("memory").queryName("from_time").trigger(processingTime="200 milliseconds").start())
        try:
            def offsets():
                return sorted(r._offset for r in spark.sql("select _offset from from_time").collect())
            poll_until(lambda: offsets() == [7, 8, 9], 60, what="the rows from the starting timestamp")
            writer.append(b"live")
            poll_until(lambda: offsets() == [7, 8, 9, 10], 60, what="a row appended after the query started")
            live = spark.sql("select payload, _timestamp from from_time where _offset = 10").collect()
            assert [(bytes(r.payload), r._timestamp) for r in live] == [(b"live", utc(BASE + 500))]
        finally:
            query.stop()


def test_a_streaming_starting_timestamp_after_every_row_fails_or_starts_at_the_end(spark, shared_uri, stream):
    raw_stream(shared_uri, stream, [BASE, BASE + 1])

    def start(table, **options):
        reader = spark.readStream.format("ledger").option("metadata", shared_uri).option("startingTimestamp",
                                                                                          str(BASE + 2))
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load(stream).writeStream.format("memory").queryName(table).trigger(
            processingTime="200 milliseconds").start()

    failing = start("strict")
    try:
        with pytest.raises(StreamingQueryException, match="startingOffsetsByTimestampStrategy=latest"):
            failing.awaitTermination(120)
    finally:
        failing.stop()

    query = start("at_end", startingOffsetsByTimestampStrategy="latest")
    try:
        poll_until(lambda: query.recentProgress, 60, what="a first micro-batch")
        with LedgerClient(shared_uri) as lc, Streams(lc).open_writer(stream) as writer:
            writer.append(b"new")
        poll_until(lambda: [bytes(r.payload) for r in spark.sql("select payload from at_end").collect()] == [b"new"],
                   60, what="the row written after the query started, and only it")
    finally:
        query.stop()


def old_format_arrow_ledger(uri, stream, ids_: range) -> None:
    """An arrow ledger as a Spark task wrote it before entry times existed (no mark, entries as they are, a row
    index at close), committed onto the stream."""
    with LedgerClient(uri) as lc:
        schema = decode_schema(streams.read_stream(lc.store, stream).value.schema)
        batch = pa.record_batch([pa.array(list(ids_), pa.int64())], schema=schema)
        index = RowIndexBuilder()
        with lc.create_ledger(custom_metadata={"stream": stream}) as ledger:
            for payload in entries_of([batch], EntryBuilder(schema, 1024)):
                index.add(entry_header(payload)[0])
                ledger.append(payload)
            ledger.close(custom_metadata={ROW_INDEX_KEY: index.index().encode()})
        streams.update_stream(lc.store, stream, lambda r: r.replace(tail=r.tail + (
            StreamLedger(ledger.ledger_id, r.next_offset, r.next_offset + len(ids_) - 1),)))


def test_ledgers_written_before_entry_times_read_with_a_null_timestamp(spark, shared_uri, stream):
    write(spark.range(0, 10, numPartitions=1), shared_uri, stream)
    old_format_arrow_ledger(shared_uri, stream, range(10, 20))
    mark = mark_after_write()
    write(spark.range(20, 30, numPartitions=1), shared_uri, stream)

    full = read(spark, shared_uri, stream, includeMetadata="true", maxPartitionBytes=0)   # a partition per ledger
    assert ids(full) == list(range(30))
    assert ids(full.filter(F.col("_timestamp").isNull())) == list(range(10, 20))
    # any comparison with _timestamp prunes the old ledger: no row of it can pass
    recent = full.filter(F.col("_timestamp") >= F.lit(utc(mark)))
    assert recent.rdd.getNumPartitions() == planned(1, 3) and ids(recent) == list(range(20, 30))
    assert full.filter(F.col("_timestamp") > F.lit(utc(0))).rdd.getNumPartitions() == planned(2, 3)
    # the time search places the old ledger by its close time: before the mark
    assert ids(read(spark, shared_uri, stream, startingTimestamp=mark)) == list(range(20, 30))


def test_ledgers_read_by_id_have_their_times_too(spark, shared_uri, stream):
    raw_stream(shared_uri, stream, [BASE + 1, BASE + 2], per_ledger=2)
    with LedgerClient(shared_uri) as lc:
        (ledger,) = streams.read_stream(lc.store, stream).value.tail
    df = read(spark, shared_uri, None, ledgers=str(ledger.ledger_id), includeMetadata="true")
    assert [(bytes(r.payload), r._offset, r._timestamp) for r in df.orderBy("entry_id").collect()] == [
        (b"e0", None, utc(BASE + 1)), (b"e1", None, utc(BASE + 2))]


@pytest.mark.parametrize("options, message", [
    ({"startingTimestamp": "soon"}, "startingTimestamp='soon': allowed values are times in milliseconds"),
    ({"startingTimestamp": "5", "startingOffsets": "0"}, "both startingOffsets='0' and startingTimestamp='5'"),
    ({"startingTimestamp": "1700000000005", "endingTimestamp": "1700000000004"},
     "endingTimestamp=1700000000004 is before startingTimestamp=1700000000005"),
    # past year 9999: an audit's read failed with OverflowError / ValueError instead
    ({"startingTimestamp": "1208925819614629174706176"},
     r"startingTimestamp='1208925819614629174706176': allowed values are times in milliseconds since the epoch "
     r"\(an integer >= 0, up to 253402300799999: 9999-12-31 23:59:59.999 UTC\)"),
    ({"startingTimestamp": "9000000000000000"}, "startingTimestamp='9000000000000000': allowed values are times"),
])
def test_bad_time_options_fail_the_read_with_a_clear_error(spark, shared_uri, stream, options, message):
    raw_stream(shared_uri, stream, [BASE])
    with pytest.raises(AnalysisException, match=message):
        read(spark, shared_uri, stream, **options).collect()
