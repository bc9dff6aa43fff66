"""connector/spark/stream_write.py commit records: one entry per query, most recent last, bounded (rule 15)."""
from connector.spark.commit import COMMITS_KEPT, new_stream
from connector.spark.stream_write import batch_committed, with_batch


def test_a_query_keeps_one_entry_moved_to_the_end_on_each_commit():
    record = with_batch(with_batch(with_batch(new_stream("s"), "a", 0), "b", 0), "a", 1)
    assert record.commits == (("b", 0), ("a", 1))
    assert batch_committed(record, "a", 1) and batch_committed(record, "a", 0) and not batch_committed(record, "a", 2)


def test_the_least_recently_committed_queries_are_evicted_first():
    record = new_stream("s")
    for n in range(COMMITS_KEPT + 3):
        record = with_batch(record, f"q{n}", 7)
    assert len(record.commits) == COMMITS_KEPT
    assert [q for q in ("q0", "q1", "q2") if record.committed_batch(q) is not None] == []
    record = with_batch(record, "q3", 8)   # q3 commits again: now the most recent, so q4 goes next
    record = with_batch(record, "new", 0)
    assert len(record.commits) == COMMITS_KEPT and record.commits[-2:] == (("q3", 8), ("new", 0))
    assert record.committed_batch("q4") is None and record.committed_batch("q5") == 7
