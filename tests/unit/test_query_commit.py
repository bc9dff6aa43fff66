"""metadata/query_commits.py, without ZooKeeper: what a query's commit record says, what a commit writes, and the
znode names of query ids."""
from connector.spark.commit import new_stream
from metadata import layout
from metadata.query_commits import QueryCommit, committing, decode_batch, encode_batch


def test_the_larger_of_the_znode_and_the_old_heads_record_counts():
    assert QueryCommit("q", None, None).last_batch is None and not QueryCommit("q", None, None).holds(0)
    assert QueryCommit("q", 4, 2).last_batch == 4
    assert QueryCommit("q", None, None, in_head=7).last_batch == 7
    commit = QueryCommit("q", 3, 5, in_head=6)
    assert commit.holds(6) and commit.holds(0) and not commit.holds(7)


def test_a_commit_sets_its_querys_znode_at_the_version_read_or_creates_it_and_moves_old_records_out():
    head = new_stream("s")
    kept, writes = committing(head, QueryCommit("query-a", 3, 5), 4)
    assert kept == head and writes == ((layout.stream_query_path("s", "query-a"), encode_batch(4), 5),)
    _, writes = committing(head, QueryCommit("query-b", None, None), 0)
    assert writes == ((layout.stream_query_path("s", "query-b"), encode_batch(0), None),)
    moved = ((layout.stream_query_path("s", "query-old"), encode_batch(9), None),)
    kept, writes = committing(head.replace(commits=(("query-old", 9), ("query-c", 1))),
                              QueryCommit("query-c", None, None, in_head=1, moved_out=moved), 2)
    assert kept.commits == () and writes == ((layout.stream_query_path("s", "query-c"), encode_batch(2), None),) + moved
    assert decode_batch(encode_batch(12)) == 12


def test_query_ids_become_znode_names_and_back():
    for query_id in ("query-0f8e", "q/with/slashes", "..", "naïve id"):
        name = layout.stream_query_path("s", query_id).rsplit("/", 1)[1]
        assert "/" not in name and name not in (".", "..") and layout.query_id_from_name(name) == query_id
