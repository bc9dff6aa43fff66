"""Seek without re-reading (issue 14 item 5, DESIGN rule 15): a read that starts at offset k inside a ledger
fetches only the entries holding offsets >= k, for batch reads (startingOffsets, splitEntries), streaming
micro-batches and Streams.read; ledgers closed without a row index still read correctly.

Rows are compared with a full read filtered (chispa). Entries fetched are counted with the client's
metrics, on partitions read in this process with the code an executor runs (reader.read(partition)).
"""
import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from connector.client import LedgerClient, Streams, metrics
from connector.spark import LedgerDataSource
from connector.spark.row_index import ROW_INDEX_KEY, RowIndex
from metadata import streams
from metadata.update_loop import update_ledger
from tests.spark.helpers import read, write

ROWS = 40_000
DEEP = 37_777


def entries_read() -> float:
    return metrics.REGISTRY.get_sample_value("ledger_client_entries_read_total") or 0.0


def source(uri, stream, **options):
    return LedgerDataSource({"metadata": uri, "path": stream, "includeMetadata": "true",
                             **{k: str(v) for k, v in options.items()}})


def read_in_process(reader, partitions) -> tuple[int, int]:
    """(rows, entries fetched) of reading the partitions as executors would."""
    before = entries_read()
    rows = sum(batch.num_rows for p in partitions for batch in reader.read(p))
    return rows, int(entries_read() - before)


def the_ledger(uri, stream):
    with LedgerClient(uri) as lc:
        record = streams.read_stream(lc.store, stream).value
        (ledger,) = streams.iter_ledgers(lc.store, record)
        return lc.ledger_metadata(ledger.ledger_id)


@pytest.fixture
def big_ledger(spark, shared_uri, stream):
    """One ledger of ROWS rows in about 500 entries of 1 KiB: more than the index has points."""
    df = spark.range(0, ROWS, numPartitions=1).select("id", F.format_string("row %010d", "id").alias("s"))
    write(df, shared_uri, stream, entryBytes=1024)
    meta = the_ledger(shared_uri, stream)
    assert meta.last_entry_id > 256
    return meta


def full_read_from(spark, uri, stream, k):
    return read(spark, uri, stream, includeMetadata="true").filter(F.col("_offset") >= k).orderBy("_offset")


def test_batch_read_from_deep_inside_a_ledger_fetches_only_the_entries_from_there(
        spark, shared_uri, stream, big_ledger):
    index = RowIndex.of(big_ledger)
    assert index is not None and index.stride > 1   # sparse: the read starts up to stride-1 entries early

    seeked = read(spark, shared_uri, stream, includeMetadata="true", startingOffsets=DEEP).orderBy("_offset")
    assert_df_equality(seeked, full_read_from(spark, shared_uri, stream, DEEP))

    ds = source(shared_uri, stream, startingOffsets=DEEP)
    reader = ds.reader(ds.schema())
    partitions = reader.partitions()
    assert [p.first_entry for p in partitions] == [index.first_entry(DEEP)]
    rows, fetched = read_in_process(reader, partitions)
    holding = big_ledger.last_entry_id - seeked.first()["_entry_id"] + 1   # entries holding rows >= DEEP
    assert rows == ROWS - DEEP
    assert holding <= fetched < holding + index.stride


def test_split_entries_plans_only_from_the_start(spark, shared_uri, stream, big_ledger):
    ds = source(shared_uri, stream, startingOffsets=DEEP, splitEntries=20)
    partitions = ds.reader(ds.schema()).partitions()
    first = RowIndex.of(big_ledger).first_entry(DEEP)
    assert partitions[0].first_entry == first and partitions[-1].last_entry == big_ledger.last_entry_id
    assert len(partitions) == -(-(big_ledger.last_entry_id - first + 1) // 20)
    seeked = read(spark, shared_uri, stream, includeMetadata="true", startingOffsets=DEEP, splitEntries=20)
    assert_df_equality(seeked.orderBy("_offset"), full_read_from(spark, shared_uri, stream, DEEP))


def test_streaming_micro_batch_from_deep_inside_a_ledger_seeks(spark, shared_uri, stream, big_ledger, tmp_path):
    ds = source(shared_uri, stream)
    reader = ds.streamReader(ds.schema())
    partitions = reader.partitions({"offset": DEEP}, {"offset": DEEP + 100})
    rows, fetched = read_in_process(reader, partitions)
    assert rows == 100
    assert fetched <= 2 * RowIndex.of(big_ledger).stride + 1   # the entries of 100 rows, and a stride each side

    query = (spark.readStream.format("ledger").option("metadata", shared_uri).option("includeMetadata", "true")
             .option("startingOffsets", str(DEEP)).load(stream)
             .writeStream.format("memory").queryName("seek_micro_batches").trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "ck")).start())
    assert query.awaitTermination(120)
    assert_df_equality(spark.table("seek_micro_batches").orderBy("_offset"),
                       full_read_from(spark, shared_uri, stream, DEEP))


def test_a_ledger_closed_without_an_index_reads_the_same_rows_searching_its_start(
        spark, shared_uri, stream, big_ledger):
    def without_index(meta):
        return meta.replace(custom_metadata=tuple(kv for kv in meta.custom_metadata if kv[0] != ROW_INDEX_KEY))

    with LedgerClient(shared_uri) as lc:
        update_ledger(lc.store, big_ledger.ledger_id, without_index)
    assert RowIndex.of(the_ledger(shared_uri, stream)) is None

    seeked = read(spark, shared_uri, stream, includeMetadata="true", startingOffsets=DEEP).orderBy("_offset")
    assert_df_equality(seeked, full_read_from(spark, shared_uri, stream, DEEP))
    ds = source(shared_uri, stream, startingOffsets=DEEP)
    reader = ds.reader(ds.schema())
    partitions = reader.partitions()
    assert [(p.first_entry, p.seek_row) for p in partitions] == [(0, DEEP)]
    rows, fetched = read_in_process(reader, partitions)
    holding = big_ledger.last_entry_id - seeked.first()["_entry_id"] + 1
    assert rows == ROWS - DEEP
    assert holding <= fetched <= holding + 12   # a binary search: about log2(entries) single-entry reads


def test_read_stream_of_a_raw_stream_starts_at_the_entry_of_its_offset(shared_uri, stream):
    with LedgerClient(shared_uri) as lc:
        with Streams(lc).open_writer(stream) as writer:
            for i in range(500):
                writer.append(f"e{i}".encode())
        before = entries_read()
        got = [(e.offset, e.payload) for e in Streams(lc).read(stream, start=450)]
        assert got == [(i, f"e{i}".encode()) for i in range(450, 500)]
        assert entries_read() - before == 50
