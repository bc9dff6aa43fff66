"""Compaction while Spark reads and writes the stream (issue 14 item 4): a tailing streaming query, batch-job commits
and streaming-sink commits go on through several compactions, and the replaced ledgers are deleted after the grace
while the query still runs; the query loses and duplicates no row, and a batch read afterwards finds every row at
its offset (compared with chispa)."""

from chispa import assert_df_equality
from pyspark.sql import functions as F

from connector.client import LedgerClient
from connector.compaction import CompactionPolicy, clean_compactions, compact_stream
from metadata import layout, streams
from tests.harness.poll import poll_until
from tests.harness.small_ledgers import CommitRounds, rows_in, tailing_query, write_jobs

GRACE = 10.0        # seconds: well above the time between a micro-batch's planning and its read on 2 busy cores
FIRST = 120         # small ledgers before the query starts
ROUNDS = 4          # each: 20 ledgers by two batch jobs, 10 by a sink micro-batch, then a compaction


def test_a_streaming_query_and_commits_during_compactions_lose_and_duplicate_no_row(spark, shared_uri, stream,
                                                                                      tmp_path):
    write_jobs(shared_uri, stream, range(FIRST))
    query = tailing_query(spark, shared_uri, stream, "during_compaction")
    rounds = CommitRounds(shared_uri, stream, tmp_path / "checkpoint", FIRST, ROUNDS)
    swaps, finished = [], []

    def compaction(lc, policy) -> None:
        result = compact_stream(lc, stream, policy)
        swaps.extend(result.runs)
        finished.extend(result.finished)   # earlier compactions past their grace

    def all_finished(lc) -> bool:
        finished.extend(clean_compactions(lc, stream).finished)
        return not lc.store.children(layout.COMPACTIONS)

    try:
        with LedgerClient(shared_uri) as lc:
            policy = CompactionPolicy(target_bytes=16 * 1024, grace=GRACE)
            compaction(lc, policy)                             # while the query reads its first micro-batches
            rounds.start()
            while rounds.next() is not None:                   # each compaction runs while the next round commits
                compaction(lc, policy)
            rounds.join()
            poll_until(lambda: all_finished(lc), timeout=120, interval=0.5, what="the compactions' graces to pass")
            ledgers = list(streams.iter_ledgers(lc.store, streams.read_stream(lc.store, stream).value))
        query.processAllAvailable()
        assert query.exception() is None
    finally:
        query.stop()

    total = rows_in(FIRST + ROUNDS * 30)
    assert len(swapped := [s for s in swaps if s.state == "swapped"]) >= 2 and len(ledgers) < FIRST
    # Every swapped compaction is finished (all_finished found no record left): by this test's calls, or by the
    # janitor of a batch job that started after its grace (connector/spark/janitor.py), which a loaded machine makes
    # likelier; nothing else was finished.
    assert set(finished) <= {s.compaction_id for s in swapped}
    expected = spark.range(total).select(F.col("id"))
    assert_df_equality(spark.table("during_compaction").orderBy("id"), expected, ignore_nullable=True)
    batch = (spark.read.format("ledger").option("metadata", shared_uri).option("includeMetadata", "true")
             .load(stream).select(F.col("_offset").alias("id")))
    assert_df_equality(batch.orderBy("id"), expected, ignore_nullable=True)
    both = spark.read.format("ledger").option("metadata", shared_uri).option("includeMetadata", "true").load(stream)
    assert both.filter(F.col("_offset") != F.col("id")).count() == 0   # every row at the offset it was written to
