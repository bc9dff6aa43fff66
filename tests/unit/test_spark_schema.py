"""connector/spark/schema.py: recorded Arrow schemas round-trip Spark types; appends must fit."""
import pyarrow as pa
import pytest
from pyspark.sql.types import (
    ArrayType, BinaryType, BooleanType, DateType, DecimalType, DoubleType, FloatType, IntegerType, LongType,
    MapType, ShortType, StringType, StructField, StructType, TimestampNTZType, TimestampType, ByteType,
)

from connector.spark.errors import SchemaMismatchError
from connector.spark.schema import (
    appendable_schema, arrow_schema_of, decode_schema, encode_schema, raw_read_schema, spark_schema_of,
    stream_read_schema,
)

ALL_TYPES = StructType([
    StructField("b", BooleanType()), StructField("i8", ByteType()), StructField("i16", ShortType()),
    StructField("i32", IntegerType(), False), StructField("i64", LongType()), StructField("f32", FloatType()),
    StructField("f64", DoubleType()), StructField("dec", DecimalType(20, 4)), StructField("s", StringType()),
    StructField("bin", BinaryType()), StructField("d", DateType()), StructField("ts", TimestampType()),
    StructField("ntz", TimestampNTZType()),
    StructField("arr", ArrayType(LongType(), False)),
    StructField("m", MapType(StringType(), DoubleType(), True)),
    StructField("st", StructType([StructField("x", IntegerType()), StructField("tags", ArrayType(StringType()))])),
])


def test_recorded_schema_round_trips_every_common_type():
    recorded = encode_schema(arrow_schema_of(ALL_TYPES))
    assert isinstance(recorded, str)
    assert spark_schema_of(decode_schema(recorded)) == ALL_TYPES


def test_append_of_the_same_schema_keeps_it():
    schema = arrow_schema_of(ALL_TYPES)
    assert appendable_schema("s", schema, schema) is schema


def test_append_with_other_nullability_widens_to_nullable():
    strict = arrow_schema_of(StructType([StructField("a", LongType(), False)]))
    loose = arrow_schema_of(StructType([StructField("a", LongType(), True)]))
    merged = appendable_schema("s", strict, loose)
    assert merged.field("a").nullable
    assert appendable_schema("s", loose, strict).equals(loose)


@pytest.mark.parametrize("other", [
    StructType([StructField("a", IntegerType())]),
    StructType([StructField("b", LongType())]),
    StructType([StructField("a", LongType()), StructField("c", StringType())]),
])
def test_incompatible_append_names_both_schemas(other):
    recorded = arrow_schema_of(StructType([StructField("a", LongType())]))
    with pytest.raises(SchemaMismatchError, match=r"stream 'events'.*struct<a:bigint>.*to match, or so$"):
        appendable_schema("events", recorded, arrow_schema_of(other), ", or so")


def test_metadata_columns():
    data = StructType([StructField("a", LongType())])
    assert stream_read_schema(data, False) == data
    assert stream_read_schema(data, True).fieldNames() == ["a", "_ledger_id", "_entry_id", "_offset", "_timestamp"]
    with pytest.raises(SchemaMismatchError, match="_offset"):
        stream_read_schema(StructType([StructField("_offset", LongType())]), True)
    assert raw_read_schema(False).simpleString() == "struct<ledger_id:bigint,entry_id:bigint,payload:binary>"
    assert raw_read_schema(True).fieldNames()[-2:] == ["_offset", "_timestamp"]


def test_arrow_schema_uses_utc_timestamps():
    schema = arrow_schema_of(StructType([StructField("ts", TimestampType())]))
    assert schema.field("ts").type == pa.timestamp("us", tz="UTC")
