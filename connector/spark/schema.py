"""Schemas: what a stream records (its Arrow schema), what Spark sees, and when an append fits.

A stream of format `arrow` records the Arrow schema of its rows as base64 of the Arrow IPC schema
message. The Arrow types are the ones Spark itself uses (`to_arrow_schema` with UTC timestamps), so
rows written by Spark read back with exactly the schema Spark expects.

includeMetadata adds where each row lives (_ledger_id, _entry_id, _offset) and when it was appended
(_timestamp, the writer's append time of its entry: all rows of one entry share it; null for rows of
ledgers written before entry times existed), as Kafka's source adds offset and timestamp.
"""
from __future__ import annotations

import base64

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import (
    ArrayType, BinaryType, DataType, LongType, MapType, StructField, StructType, TimestampType,
)

from connector.spark.errors import SchemaMismatchError

LEDGER_ID = "_ledger_id"
ENTRY_ID = "_entry_id"
OFFSET = "_offset"
TIMESTAMP = "_timestamp"
METADATA_COLUMNS = (LEDGER_ID, ENTRY_ID, OFFSET, TIMESTAMP)
TIMESTAMP_FIELD = StructField(TIMESTAMP, TimestampType(), True)   # null: written without entry times

RAW_SCHEMA = StructType(
    [
        StructField("ledger_id", LongType(), False),
        StructField("entry_id", LongType(), False),
        StructField("payload", BinaryType(), False),
    ]
)


def arrow_schema_of(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark uses for these rows (the one read() batches must match exactly)."""
    return to_arrow_schema(schema, timezone="UTC", error_on_duplicated_field_names_in_struct=True)


def spark_schema_of(schema: pa.Schema) -> StructType:
    return from_arrow_schema(schema, prefer_timestamp_ntz=True)


def encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def decode_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def stream_read_schema(data: StructType, include_metadata: bool) -> StructType:
    """Rows of an arrow stream, optionally followed by where each row lives."""
    if not include_metadata:
        return data
    clash = [c for c in METADATA_COLUMNS if c in data.fieldNames()]
    if clash:
        raise SchemaMismatchError(
            f"the stream has column(s) {', '.join(clash)}, which includeMetadata would add again; "
            "read without includeMetadata"
        )
    return StructType(data.fields + [StructField(c, LongType(), False) for c in (LEDGER_ID, ENTRY_ID, OFFSET)]
                      + [TIMESTAMP_FIELD])


def check_loaded_schema(stream: str, loaded: StructType, current: StructType) -> None:
    """A read planned now with the schema its DataFrame was loaded with (loaded) must get the rows the stream holds
    now (current: its read schema now) as they are: a column that became nullable since (an append of nulls)
    read as NOT NULL makes Spark answer `isNull` with nothing and fail on collect, and a type changed since (an
    overwrite) would be cast (epoch milliseconds read as 1970 timestamps). Refused, saying to load it again."""
    fields = {field.name: field for field in current.fields}
    for field in loaded.fields:
        now = fields.get(field.name)
        if now is None:
            why = f"column {field.name!r} is no longer in it"
        elif now.dataType != field.dataType:
            why = f"column {field.name!r} is {now.dataType.simpleString()} now, not {field.dataType.simpleString()}"
        elif now.nullable and not field.nullable:
            why = f"column {field.name!r} may hold nulls now"
        else:
            continue
        raise SchemaMismatchError(
            f"stream {stream!r} changed since this DataFrame was loaded, or the schema given does not match it "
            f"({why}): load it again (spark.read or spark.readStream .format(\"ledger\")...load(); a streaming "
            "query: start it again), without a schema of your own"
        )


def raw_read_schema(include_metadata: bool) -> StructType:
    """Raw entries; includeMetadata adds the stream offset (null for ledgers read by id) and the append time."""
    if not include_metadata:
        return RAW_SCHEMA
    return StructType(RAW_SCHEMA.fields + [StructField(OFFSET, LongType(), True), TIMESTAMP_FIELD])


def appendable_schema(stream: str, recorded: pa.Schema, incoming: pa.Schema, other_remedy: str = "") -> pa.Schema:
    """The schema to record after appending rows of `incoming`; raises if they do not fit.

    Names and types must match in order. Nullability may differ: the recorded schema then becomes
    nullable throughout, which accepts both the old and the new rows. `other_remedy` ends the error's
    advice with what this kind of writer can do besides matching the schema.
    """
    if recorded.equals(incoming):
        return recorded
    old, new = spark_schema_of(recorded), spark_schema_of(incoming)
    if old.simpleString() != new.simpleString():
        raise SchemaMismatchError(
            f"cannot append to stream {stream!r}: it holds rows of {old.simpleString()}, the DataFrame has "
            f"{new.simpleString()}; select/cast the columns to match{other_remedy}"
        )
    return arrow_schema_of(_nullable(old))


def _nullable(data_type: DataType) -> DataType:
    if isinstance(data_type, StructType):
        return StructType([StructField(f.name, _nullable(f.dataType), True, f.metadata) for f in data_type.fields])
    if isinstance(data_type, ArrayType):
        return ArrayType(_nullable(data_type.elementType), True)
    if isinstance(data_type, MapType):
        return MapType(_nullable(data_type.keyType), _nullable(data_type.valueType), True)
    return data_type
