"""Issue 14's combined test: a tailing streaming query reads on while compactions rewrite the stream's small
ledgers and truncations cut off what the query has already read, and batch-job and sink commits keep
landing. The query loses and duplicates no row; a batch read afterwards holds exactly the rows from the
stream's new first offset on, each at its offset (compared with chispa)."""
import json

from chispa import assert_df_equality
from pyspark.sql import functions as F

from connector.client import LedgerClient
from connector.compaction import CompactionPolicy, clean_compactions, compact_stream
from connector.retention import truncate_stream
from metadata import layout, streams
from tests.harness.poll import poll_until
from tests.harness.small_ledgers import CommitRounds, rows_in, tailing_query, write_jobs

GRACE = 10.0
FIRST = 120
ROUNDS = 4


def consumed(query) -> int:
    """The first offset the query has not read yet (its last micro-batch's end)."""
    progress = query.lastProgress
    if not progress or not progress["sources"]:
        return 0
    return json.loads(progress["sources"][0]["endOffset"] or '{"offset": 0}')["offset"]


def test_compaction_truncation_and_commits_under_a_streaming_query_lose_and_duplicate_no_row(spark, shared_uri,
                                                                                             stream, tmp_path):
    write_jobs(shared_uri, stream, range(FIRST))
    query = tailing_query(spark, shared_uri, stream, "during_compaction_and_truncation")
    rounds = CommitRounds(shared_uri, stream, tmp_path / "checkpoint", FIRST, ROUNDS)
    cuts = []
    try:
        with LedgerClient(shared_uri) as lc:
            policy = CompactionPolicy(target_bytes=16 * 1024, grace=GRACE)
            compact_stream(lc, stream, policy)
            rounds.start()
            while rounds.next() is not None:
                query.processAllAvailable()   # while the next round commits
                cuts.append(truncate_stream(lc, stream, consumed(query)))   # only what the query has read
                compact_stream(lc, stream, policy)
            rounds.join()
            poll_until(lambda: not (clean_compactions(lc, stream) and lc.store.children(layout.COMPACTIONS)),
                       timeout=120, interval=0.5, what="the compactions' graces to pass")
            first_offset = streams.read_stream(lc.store, stream).value.first_offset
        query.processAllAvailable()
        assert query.exception() is None
    finally:
        query.stop()

    total = rows_in(FIRST + ROUNDS * 30)
    assert first_offset > 0 and sum(c.ledgers for c in cuts) > 0, f"no truncation cut anything: {cuts}"
    assert_df_equality(spark.table("during_compaction_and_truncation").orderBy("id"),
                       spark.range(total).select(F.col("id")), ignore_nullable=True)
    batch = (spark.read.format("ledger").option("metadata", shared_uri).option("includeMetadata", "true")
             .load(stream))
    assert batch.filter(F.col("_offset") != F.col("id")).count() == 0
    assert_df_equality(batch.select(F.col("_offset").alias("id")).orderBy("id"),
                       spark.range(first_offset, total).select(F.col("id")), ignore_nullable=True)


def test_a_read_that_plans_no_partition_is_empty(spark, shared_uri, stream):
    """Issue 16: a stream written with 0 rows has a schema, but count() failed in the placeholder partition
    Spark reads when a source plans none ('InputPartition' object has no attribute 'ledger_id')."""
    spark.range(0).write.format("ledger").option("metadata", shared_uri).mode("append").save(stream)
    df = spark.read.format("ledger").option("metadata", shared_uri).load(stream)
    assert df.columns == ["id"] and df.count() == 0
