"""Reading back what Spark wrote: every common type, metadata columns, offsets, pruning, raw and view modes."""
import datetime
import decimal

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from pyspark.sql.datasource import GreaterThanOrEqual, In, LessThan
from pyspark.sql.types import (
    ArrayType, BinaryType, BooleanType, ByteType, DateType, DecimalType, DoubleType, FloatType, IntegerType,
    LongType, MapType, ShortType, StringType, StructField, StructType, TimestampNTZType, TimestampType,
)

from connector.spark.datasource import LedgerDataSource
from connector.spark.encoding import MAGIC
from connector.spark.options import LedgerOptions
from connector.spark.read import PruningLedgerReader
from tests.spark.helpers import planned, read, write

SCHEMA = StructType([
    StructField("id", LongType(), False), StructField("b", BooleanType()), StructField("i8", ByteType()),
    StructField("i16", ShortType()), StructField("i32", IntegerType()), StructField("f32", FloatType()),
    StructField("f64", DoubleType()), StructField("dec", DecimalType(20, 4)), StructField("s", StringType()),
    StructField("bin", BinaryType()), StructField("d", DateType()), StructField("ts", TimestampType()),
    StructField("ntz", TimestampNTZType()), StructField("arr", ArrayType(LongType())),
    StructField("m", MapType(StringType(), DoubleType())),
    StructField("st", StructType([StructField("x", IntegerType()), StructField("tags", ArrayType(StringType())),
                                  StructField("inner", StructType([StructField("z", StringType())]))])),
])


def row(i):
    return (
        i, i % 2 == 0, i % 100, i * 3, i * 1000, i / 4, i / 3, decimal.Decimal(i) / 7,
        f"text {i} ünïcode", bytes([i % 256]) * (i % 5), datetime.date(2024, 1, 1) + datetime.timedelta(days=i),
        datetime.datetime(2024, 1, 1, 12, 30) + datetime.timedelta(seconds=i * 61),
        datetime.datetime(2020, 6, 1) + datetime.timedelta(minutes=i), [i, i + 1, None][: i % 4],
        {"a": i / 2, "b": None}, (i, [f"t{i}", None], (f"z{i}",)),
    )


def nulls(i):
    return (i,) + (None,) * (len(SCHEMA.fields) - 1)


def test_round_trip_of_every_common_type(spark, shared_uri, stream):
    df = spark.createDataFrame([row(i) for i in range(300)] + [nulls(i) for i in range(300, 310)], SCHEMA)
    write(df, shared_uri, stream, entryBytes=4096, compression="lz4")
    back = read(spark, shared_uri, stream)
    assert back.schema == SCHEMA
    assert_df_equality(back.orderBy("id"), df.orderBy("id"))


@pytest.fixture
def two_ledgers(spark, shared_uri, stream):
    df = spark.range(0, 1000, numPartitions=2).select("id", F.col("id").cast("string").alias("s"))
    write(df, shared_uri, stream, entryBytes=1024)
    return df


def test_metadata_columns_and_offsets(spark, shared_uri, stream, two_ledgers):
    back = read(spark, shared_uri, stream, includeMetadata="true")
    assert back.columns == ["id", "s", "_ledger_id", "_entry_id", "_offset", "_timestamp"]
    assert back.filter("_offset != id").count() == 0  # offsets follow partition order, one per row
    ledgers = [r[0] for r in back.groupBy("_ledger_id").agg(F.min("id")).orderBy("min(id)").collect()]
    assert len(ledgers) == 2
    assert back.select("_ledger_id", "_entry_id").distinct().count() > 10  # ~1 KiB entries

    window = read(spark, shared_uri, stream, startingOffsets=250, endingOffsets=750)
    assert sorted(r.id for r in window.collect()) == list(range(250, 750))

    # one partition per ledger (small ledgers are not packed), so that pruning shows in the partition count
    pruned = read(spark, shared_uri, stream, includeMetadata="true", maxPartitionBytes=0).filter(
        F.col("_ledger_id") == ledgers[1])
    assert pruned.rdd.getNumPartitions() == planned(1, 2) and pruned.count() == 500
    by_offset = read(spark, shared_uri, stream, includeMetadata="true", maxPartitionBytes=0).filter(
        "_offset >= 600 AND _offset < 610")
    assert by_offset.rdd.getNumPartitions() == planned(1, 2)
    assert [r.id for r in by_offset.orderBy("id").collect()] == list(range(600, 610))


def test_a_dataframe_reused_after_filtered_queries_reads_every_row(spark, shared_uri, stream, two_ledgers):
    """Seen on main: with pushdown on, a DataFrame's query filtering on _offset or _timestamp left its pruned
    plan behind for the same DataFrame's later queries (a count gave 22,048 of 40,000 rows): Spark 4.x keeps
    the read planned during filter pushdown on the DataFrame's data source and reuses it for every later scan
    of it that pushes no filter. Whatever the Spark, each query of a reused DataFrame gets all its rows."""
    assert spark.conf.get("spark.sql.python.filterPushdown.enabled") == "true"
    df = read(spark, shared_uri, stream, includeMetadata="true")
    assert df.where(F.col("_offset").isin(0, 999)).count() == 2
    assert df.count() == 1000
    assert df.where(F.col("_offset") >= 500).count() == 500
    assert sorted(r.id for r in df.select("id").collect()) == list(range(1000))
    assert df.where(F.col("_timestamp") < F.lit(0).cast("timestamp")).count() == 0
    assert df.groupBy("_ledger_id").count().count() == 2
    assert df.where("id < 10").count() == 10


def test_the_pruning_reader_plans_only_what_its_pushed_filters_can_match(spark, shared_uri, stream, two_ledgers):
    """The reader Spark gets for metadata-column reads where it keeps a pushdown's plan to its own scan,
    driven here as Spark's filter-pushing worker drives it (pushFilters, then partitions), on any Spark."""
    source = LedgerDataSource({"metadata": shared_uri, "path": stream, "includeMetadata": "true",
                               "maxPartitionBytes": "0"})   # a partition per ledger: pruning shows in their count
    schema = source.schema()

    def planned(*filters):
        reader = PruningLedgerReader(LedgerOptions.parse(source.options), schema, raw=False)
        assert list(reader.pushFilters(list(filters))) == list(filters)    # Spark still applies every filter
        parts = reader.partitions()
        rows = [row["id"] for part in parts for batch in reader.read(part) for row in batch.to_pylist()]
        return len(parts), sorted(rows)

    assert planned() == (2, list(range(1000)))
    assert planned(GreaterThanOrEqual(("_offset",), 500)) == (1, list(range(500, 1000)))
    assert planned(In(("_offset",), (0, 999)))[0] == 2
    assert planned(GreaterThanOrEqual(("_offset",), 600), LessThan(("_offset",), 610)) == (1, list(range(600, 610)))
    assert planned(LessThan(("_offset",), 0)) == (0, [])


def test_split_entries(spark, shared_uri, stream, two_ledgers):
    split = read(spark, shared_uri, stream, splitEntries=3)
    assert split.rdd.getNumPartitions() > 4
    assert_df_equality(split.orderBy("id"), two_ledgers.orderBy("id"), ignore_nullable=True)


def test_raw_ledgers_and_metadata_view(spark, shared_uri, stream, two_ledgers):
    view = read(spark, shared_uri, stream, view="ledgers").orderBy("first_offset").collect()
    assert [(v.stream, v.state, v.first_offset, v.last_offset) for v in view] == [
        (stream, "CLOSED", 0, 499), (stream, "CLOSED", 500, 999)]
    assert view[0].ensemble_size == 3 and view[0].custom["spark.partition"] == "0"
    ids = ",".join(str(v.ledger_id) for v in view)
    raw = read(spark, shared_uri, None, ledgers=ids, includeMetadata="true")
    assert raw.columns == ["ledger_id", "entry_id", "payload", "_offset", "_timestamp"]
    entries = raw.collect()
    assert len(entries) == sum(v.last_entry_id + 1 for v in view)
    assert all(e.payload[:4] == MAGIC and e._offset is None for e in entries)
    everything = read(spark, shared_uri, None, view="ledgers").filter(F.col("stream") == stream)
    assert everything.count() == 2


def test_reads_without_metadata_columns_need_no_pushdown_setting(spark, shared_uri, stream, two_ledgers):
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
    try:
        assert read(spark, shared_uri, stream).filter("id >= 10").count() == 990
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")


def test_metadata_columns_need_no_pushdown_setting_and_prune_where_spark_allows_it(spark, shared_uri, stream, two_ledgers):
    """Issue 16: includeMetadata failed with DATA_SOURCE_PUSHDOWN_DISABLED while the setting was off, even
    without a filter. Off: Spark filters the rows itself, every ledger is planned; on: whole ledgers pruned."""
    def offsets_from_500():   # a partition per ledger (small ledgers are not packed): pruning shows in their count
        return read(spark, shared_uri, stream, includeMetadata="true", maxPartitionBytes=0).filter(
            F.col("_offset") >= 500)

    spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
    try:
        assert read(spark, shared_uri, stream, includeMetadata="true").count() == 1000
        off = offsets_from_500()
        assert off.count() == 500 and off.rdd.getNumPartitions() == 2
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    on = offsets_from_500()
    assert on.count() == 500 and on.rdd.getNumPartitions() == planned(1, 2)


def test_a_copy_of_a_read_with_metadata_keeps_the_copied_metadata_values(spark, shared_uri, stream):
    """Spark read audit 2026-11-29: a stream written from a read with includeMetadata has _offset, _ledger_id, ...
    columns of its own; reading it (without includeMetadata, as the refusal of includeMetadata on it advises)
    returned this read's offsets, ledgers and times in them instead of the copied values."""
    write(spark.range(0, 300, numPartitions=1), shared_uri, stream + "-a")
    copy = read(spark, shared_uri, stream + "-a", includeMetadata="true", startingOffsets=100)
    write(copy, shared_uri, stream + "-b")
    back = read(spark, shared_uri, stream + "-b").collect()
    assert sorted((r.id, r._offset) for r in back) == [(i, i) for i in range(100, 300)]


def test_a_dataframe_loaded_before_its_stream_took_nulls_is_refused_with_what_to_do(spark, shared_uri, stream):
    """Spark read audit 2026-11-29: a DataFrame loaded while a column was NOT NULL read the nulls appended since
    as NOT NULL: its collect failed with a JVM error (IllegalStateException), and casts hid a type an overwrite
    changed. A read planned now checks the loaded schema against the stream's, as Delta does. (Spark answers
    `isNull` on a column the DataFrame holds NOT NULL without reading, so that filter still counts no row.)"""
    write(spark.range(0, 10, numPartitions=1), shared_uri, stream)       # id long NOT NULL
    loaded = read(spark, shared_uri, stream)
    nullable = spark.createDataFrame([(None,), (None,)], StructType([StructField("id", LongType(), True)]))
    write(nullable, shared_uri, stream)                                    # the stream's id becomes nullable
    assert read(spark, shared_uri, stream).where(F.col("id").isNull()).count() == 2   # loaded again: right
    with pytest.raises(Exception, match="changed since this DataFrame was loaded, or the schema given does not match it .column 'id' may hold nulls now"):
        loaded.collect()
