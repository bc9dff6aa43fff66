"""Batch reads and micro-batches pack runs of small ledgers into one Spark partition each
(connector/spark/planning.py, pack_partitions; option maxPartitionBytes): a streaming sink leaves one small ledger
per task and micro-batch, and Spark spends about 50 ms of a core on every Python task however little it reads.
The rows must be exactly those of a read planned one partition per ledger (maxPartitionBytes=0), with their
metadata, from any starting offset and under pruning filters. Compared with chispa against that read."""
import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from connector.client import LedgerClient
from connector.retention import truncate_stream
from connector.spark import LedgerDataSource
from connector.spark.errors import DataLossError
from connector.spark.planning import LEDGER_OPEN_COST_BYTES, LedgerRun
from tests.spark.helpers import read, stream_ledgers, write

LEDGERS = 30           # one per write task
ROWS_EACH = 20


@pytest.fixture
def small_ledgers(spark, shared_uri, stream) -> str:
    df = spark.range(0, LEDGERS * ROWS_EACH, numPartitions=LEDGERS).select(
        "id", F.format_string("row %05d", "id").alias("s"))
    write(df, shared_uri, stream)
    assert len(stream_ledgers(shared_uri, stream)) == LEDGERS
    return stream


def both(spark, uri, stream, **options):
    """(the packed read, the read planned one partition per ledger), with the metadata columns, by offset."""
    packed = read(spark, uri, stream, includeMetadata="true", **options)
    single = read(spark, uri, stream, includeMetadata="true", maxPartitionBytes=0, **options)
    return packed, single


def test_small_ledgers_share_partitions_and_every_row_comes_back_with_its_metadata(spark, shared_uri, small_ledgers):
    packed, single = both(spark, shared_uri, small_ledgers)
    assert single.rdd.getNumPartitions() == LEDGERS
    # The default maxPartitionBytes (32 MiB) holds 7 ledgers of a few hundred bytes and their open costs, not 8
    per_partition = 32 * 1024 * 1024 // LEDGER_OPEN_COST_BYTES - 1
    assert packed.rdd.getNumPartitions() == -(-LEDGERS // per_partition)
    assert packed.count() == LEDGERS * ROWS_EACH
    assert_df_equality(packed.orderBy("_offset"), single.orderBy("_offset"))
    # each Spark partition holds whole ledgers in stream order
    spans = packed.select(F.spark_partition_id().alias("p"), "_ledger_id", "_offset").groupBy("p").agg(
        F.countDistinct("_ledger_id").alias("ledgers"), F.min("_offset").alias("lo"), F.max("_offset").alias("hi"),
        F.count("*").alias("rows")).orderBy("lo").collect()
    assert [r.ledgers for r in spans] == [7, 7, 7, 7, 2]
    assert all(r.hi - r.lo + 1 == r.rows for r in spans)


def test_a_start_inside_a_packed_run_and_pruning_filters_read_the_same_rows(spark, shared_uri, small_ledgers):
    start = 7 * ROWS_EACH + 5   # inside the eighth ledger
    packed, single = both(spark, shared_uri, small_ledgers, startingOffsets=start, endingOffsets=555)
    assert_df_equality(packed.orderBy("_offset"), single.orderBy("_offset"))
    assert packed.count() == 555 - start
    packed, single = both(spark, shared_uri, small_ledgers)
    assert_df_equality(packed.filter((F.col("_offset") >= 233) & (F.col("_offset") < 420)).orderBy("_offset"),
                       single.filter((F.col("_offset") >= 233) & (F.col("_offset") < 420)).orderBy("_offset"))


def test_a_smaller_max_partition_bytes_packs_fewer_ledgers(spark, shared_uri, small_ledgers):
    packed = read(spark, shared_uri, small_ledgers, maxPartitionBytes=3 * LEDGER_OPEN_COST_BYTES)
    assert packed.rdd.getNumPartitions() == LEDGERS // 2   # two small ledgers and their open costs fit, not three
    assert packed.count() == LEDGERS * ROWS_EACH


def test_a_micro_batch_over_sealed_small_ledgers_packs_them_and_reads_every_row_once(
        spark, shared_uri, small_ledgers):
    source = LedgerDataSource({"metadata": shared_uri, "path": small_ledgers})
    reader = source.streamReader(source.schema())
    partitions = reader.partitions({"offset": 3}, {"offset": 550})
    assert len(partitions) == 4 and all(isinstance(p, LedgerRun) for p in partitions)
    assert sum(batch.num_rows for p in partitions for batch in reader.read(p)) == 550 - 3

    query = (spark.readStream.format("ledger").option("metadata", shared_uri).option("includeMetadata", "true")
             .load(small_ledgers).writeStream.format("memory").queryName("packed_tail")
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    streamed = spark.sql("select * from packed_tail").orderBy("_offset")
    _, single = both(spark, shared_uri, small_ledgers)
    assert_df_equality(streamed, single.orderBy("_offset"))


@pytest.mark.parametrize("fail", [True, False])
def test_a_packed_micro_batch_whose_first_ledgers_are_truncated_after_planning(spark, shared_uri, small_ledgers,
                                                                               fail):
    source = LedgerDataSource({"metadata": shared_uri, "path": small_ledgers, "includeMetadata": "true",
                               "failOnDataLoss": str(fail).lower()})
    reader = source.streamReader(source.schema())
    partitions = reader.partitions({"offset": 0}, {"offset": 300})
    assert isinstance(partitions[0], LedgerRun)
    with LedgerClient(shared_uri) as lc:
        truncate_stream(lc, small_ledgers, 5 * ROWS_EACH)   # its first five ledgers are deleted after the plan
    if fail:
        with pytest.raises(DataLossError, match="the first offset the stream still holds is 100"):
            [batch for p in partitions for batch in reader.read(p)]
    else:
        offsets = [o for p in partitions for batch in reader.read(p) for o in batch.column("_offset").to_pylist()]
        assert offsets == list(range(5 * ROWS_EACH, 300))
