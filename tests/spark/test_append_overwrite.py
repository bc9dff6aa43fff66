"""Appends, overwrites and a stream read by another Spark application."""
import json

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from connector.client import LedgerClient, NoSuchLedgerError
from metadata.store import MetadataStore
from metadata.streams import iter_ledgers, read_stream
from tests.spark.helpers import read, run_application, stream_ledgers, write


def numbers(spark, first, count, partitions=2):
    return spark.range(first, first + count, numPartitions=partitions).select("id", (F.col("id") * 2).alias("twice"))


def test_append_twice_then_read(spark, shared_uri, stream):
    write(numbers(spark, 0, 500), shared_uri, stream)
    write(numbers(spark, 500, 300, partitions=3), shared_uri, stream)
    back = read(spark, shared_uri, stream, includeMetadata="true")
    assert_df_equality(back.select("id", "twice").orderBy("id"), numbers(spark, 0, 800).orderBy("id"),
                       ignore_nullable=True)
    assert back.filter("_offset != id").count() == 0
    with MetadataStore(shared_uri) as store:
        ledgers = list(iter_ledgers(store, read_stream(store, stream).value))
    assert [s.first_offset for s in ledgers] == [0, 250, 500, 600, 700]
    assert ledgers[-1].last_offset == 799
    assert sorted(stream_ledgers(shared_uri, stream)) == sorted(s.ledger_id for s in ledgers)


def test_overwrite_replaces_rows_and_deletes_old_ledgers(spark, shared_uri, stream):
    write(numbers(spark, 0, 400), shared_uri, stream)
    old = stream_ledgers(shared_uri, stream)
    replacement = spark.range(0, 50, numPartitions=1).select(F.col("id").cast("string").alias("name"))
    write(replacement, shared_uri, stream, mode="overwrite")
    assert_df_equality(read(spark, shared_uri, stream).orderBy("name"), replacement.orderBy("name"),
                       ignore_nullable=True)
    new = stream_ledgers(shared_uri, stream)
    assert len(new) == 1 and not set(new) & set(old)
    with LedgerClient(shared_uri) as lc:
        for ledger_id in old:
            with pytest.raises(NoSuchLedgerError):
                lc.ledger_metadata(ledger_id)


def test_stream_written_by_one_application_is_read_by_another(spark, shared_uri, stream, tmp_path):
    write(numbers(spark, 0, 1234, partitions=3), shared_uri, stream)
    out = run_application("tests.spark.other_session", shared_uri, stream, log=tmp_path / "reader.log", timeout=240)
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"count": 1234, "sum_id": sum(range(1234)), "sum_twice": 2 * sum(range(1234))}


def test_a_row_larger_than_an_entry_fails_clearly_and_leaves_nothing(spark, shared_uri, stream):
    """Issue 16: a 9 MiB cell (the nodes take entries of at most 8 MiB) failed with NotEnoughNodesError, the
    too-large entry taken for failed nodes. Now the task fails naming the row's size and the limit, before
    the entry is sent; the stream keeps what it had and no ledger of the failed job is left."""
    write(spark.range(0, 100).select("id", F.lit("small").alias("s")), shared_uri, stream)
    kept = stream_ledgers(shared_uri, stream)
    huge = spark.range(0, 3, numPartitions=1).select(
        "id", F.when(F.col("id") == 1, F.expr("repeat('x', 9 * 1024 * 1024)")).otherwise("small").alias("s"))
    with pytest.raises(Exception) as failed:
        write(huge, shared_uri, stream)
    message = str(failed.value)
    assert "RowTooLargeError" in message and "8,388,60" in message and "maxEntryBytes" in message, message[-3000:]
    assert "NotEnoughNodesError" not in message
    assert read(spark, shared_uri, stream).count() == 100
    assert sorted(stream_ledgers(shared_uri, stream)) == sorted(kept)
