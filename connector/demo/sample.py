"""The sample rows of the demo and the benchmark: id long, ts timestamp, key string (16 B), value binary (192 B).

The same rows come from Spark (sample_dataframe) and from plain Arrow (sample_batch, for a writer
outside Spark), so a reader can check that every row came back.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

BASE_MILLIS = 1_700_000_000_000
KEYS = 100_000


def sample_dataframe(spark: SparkSession, rows: int, first_id: int = 0, partitions: int | None = None) -> DataFrame:
    ids = spark.range(first_id, first_id + rows, numPartitions=partitions or spark.sparkContext.defaultParallelism)
    return ids.select(
        F.col("id"),
        F.timestamp_millis(F.lit(BASE_MILLIS) + F.col("id")).alias("ts"),
        F.format_string("key-%012d", F.col("id") % KEYS).alias("key"),
        F.unhex(F.repeat(F.sha2(F.col("id").cast("string"), 256), 6)).alias("value"),
    )


def sample_batch(first_id: int, rows: int, schema: pa.Schema) -> pa.RecordBatch:
    """The rows first_id.. of sample_dataframe as an Arrow batch of the stream's recorded schema."""
    ids = np.arange(first_id, first_id + rows, dtype=np.int64)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(ids),
            pa.array((ids + BASE_MILLIS) * 1000, pa.timestamp("us", tz="UTC")),
            pa.array([f"key-{i % KEYS:012d}" for i in ids.tolist()]),
            pa.array([hashlib.sha256(str(i).encode()).digest() * 6 for i in ids.tolist()], pa.binary()),
        ],
        schema=schema,
    )
