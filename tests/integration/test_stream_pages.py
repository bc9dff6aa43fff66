"""Paged stream metadata (metadata/streams.py, issue 14 item 1) against a real ZooKeeper: the head stays small and a
commit writes O(1) znodes however long the stream, a range read fetches only its pages, old single-record streams
are read and migrated page by page, offsets only grow through overwrites, and concurrent commits lose nothing.

Histories are built through the metadata API with made-up ledger ids: no ledger is written.
"""
import json
import threading

import pyarrow as pa
import pytest

from connector.spark.commit import TaskLedger, committed, new_stream
from connector.spark.spans import batch_spans
from metadata import layout, serde, streams
from metadata.errors import OffsetsGoneError
from metadata.model import StreamLedger, StreamRecord
from metadata.query_commits import committing, query_commits, read_query_commit
from metadata.store import MetadataStore
from metadata.streams import PAGE_LEDGERS, PAGES_PER_UPDATE
from tests.harness.stream_fixtures import delete_head

BATCH = 100
HISTORY = 60_000
FIRST_ID = 1_000_000_000   # ten-digit ledger ids, as a long-lived cluster has
ZNODE_LIMIT = 64 * 1024
HEAD_LIMIT = 16 * 1024
OLD_LAYOUT_LIMIT = 1024 * 1024   # ZooKeeper's jute.maxbuffer: the old one-znode stream failed past it


def rows_of(ledger_id: int) -> int:
    return 1 + ledger_id % 7


def appended(record: StreamRecord, ledger_ids) -> StreamRecord:
    """record with closed ledgers appended at its next offset, as a commit adds its task ledgers."""
    offset = record.next_offset
    added = []
    for ledger_id in ledger_ids:
        added.append(StreamLedger(ledger_id, offset, offset + rows_of(ledger_id) - 1))
        offset += rows_of(ledger_id)
    return record.replace(tail=record.tail + tuple(added))


def znode_sizes(store: MetadataStore, name: str) -> tuple[int, dict[str, int]]:
    """(head size, {page name: size}) in bytes, as stored in ZooKeeper."""
    head = store.read(layout.stream_path(name), len).value
    return head, {layout.page_name(page): store.read(layout.stream_page_path(name, page), len).value
                  for page in streams.list_pages(store, name)}


def build_history(store: MetadataStore, name: str, ledgers: int = HISTORY) -> tuple[list[int], int]:
    """A raw stream of `ledgers` closed ledgers committed BATCH at a time; returns the pages each commit created
    and the largest the head ever was (bytes)."""
    streams.create_stream(store, StreamRecord(name, "raw"))
    created, largest_head = [], 0
    for start in range(0, ledgers, BATCH):
        before = len(streams.list_pages(store, name))
        ids = range(FIRST_ID + start, FIRST_ID + start + BATCH)
        streams.update_stream(store, name, lambda r: appended(r, ids))
        created.append(len(streams.list_pages(store, name)) - before)
        largest_head = max(largest_head, store.read(layout.stream_path(name), len).value)
    return created, largest_head


def check_contiguous(ledgers: list[StreamLedger], first_id: int = FIRST_ID, first_offset: int = 0) -> None:
    assert [s.ledger_id for s in ledgers] == list(range(first_id, first_id + len(ledgers)))
    offset = first_offset
    for ledger in ledgers:
        assert (ledger.first_offset, ledger.last_offset) == (offset, offset + rows_of(ledger.ledger_id) - 1)
        offset = ledger.last_offset + 1


def test_commits_go_on_past_the_old_limit_with_small_znodes_and_one_page_per_commit(store):
    created, largest_head = build_history(store, "events")

    head = streams.read_stream(store, "events").value
    ledgers = list(streams.iter_ledgers(store, head))
    check_contiguous(ledgers)
    assert len(ledgers) == HISTORY
    old_layout = serde.encode_stream(StreamRecord("events", "raw", tail=tuple(ledgers)))
    assert len(old_layout) > OLD_LAYOUT_LIMIT   # one znode could not hold this stream any more

    head_size, page_sizes = znode_sizes(store, "events")
    print(f"\n{HISTORY} ledgers: head {head_size} B now ({len(head.tail)} in its tail), at most {largest_head} B; "
          f"{len(page_sizes)} pages of {min(page_sizes.values())}..{max(page_sizes.values())} B; "
          f"one znode would be {len(old_layout)} B")
    assert largest_head < HEAD_LIMIT and len(head.tail) <= PAGE_LEDGERS + BATCH
    assert max(page_sizes.values()) < ZNODE_LIMIT
    assert len(page_sizes) == (HISTORY - len(head.tail)) // PAGE_LEDGERS
    # Each commit wrote the head and at most one page: O(1) znodes, whatever the history.
    assert max(created) == 1 and sum(created) == len(page_sizes)


class CountingStore(MetadataStore):
    """A metadata store that records the page znodes read, the listings of the stream's books and pages, and the
    names those listings returned."""

    def __init__(self, uri: str):
        super().__init__(uri)
        self.pages_read: list[str] = []
        self.listings = 0
        self.names = 0

    def read(self, path, decode):
        if "/pages/" in path or "/books/" in path:
            self.pages_read.append(path.rsplit("/", 1)[1])
        return super().read(path, decode)

    def children(self, path):
        listed = super().children(path)
        if path.endswith("/pages") or "/books" in path:
            self.listings += 1
            self.names += len(listed)
        return listed


def test_a_range_deep_in_a_long_stream_reads_only_the_pages_it_needs(store, metadata_uri):
    build_history(store, "events")
    with CountingStore(metadata_uri) as counting:
        head = streams.read_stream(counting, "events").value
        pages = streams.live_pages(counting, head)
        wanted = pages[100], pages[101]
        lo, hi = wanted[0].first_offset + 5, wanted[1].first_offset + 5
        counting.listings = 0

        ledgers = list(streams.iter_ledgers(counting, head, lo, hi))
        assert ledgers[0].first_offset <= lo <= ledgers[0].last_offset
        assert ledgers[-1].first_offset <= hi <= ledgers[-1].last_offset
        assert sorted(counting.pages_read) == sorted(layout.page_name(p) for p in wanted)
        assert counting.listings == 2   # the book names, then the one book holding the range

        # A micro-batch plans the same way (raw: no ledger metadata needed): its own pages, nothing else.
        counting.pages_read.clear()
        spans, _ = batch_spans(counting, head, lo, hi)
        assert [s.ledger_id for s in spans] == [s.ledger_id for s in ledgers]
        assert len(counting.pages_read) == 2

        # A range inside the tail lists and reads no page at all.
        counting.pages_read.clear()
        counting.listings = 0
        tail_range = list(streams.iter_ledgers(counting, head, head.tail[3].first_offset, head.tail[5].last_offset))
        assert tail_range == list(head.tail[3:6])
        assert counting.pages_read == [] and counting.listings == 0

        # Membership of recent ledgers (a commit's read-back, a sweep) reads only the pages sealed since.
        recent = [head.tail[0].ledger_id - 1, head.tail[-1].ledger_id, FIRST_ID + HISTORY + 5]
        assert streams.held_ledgers(counting, head, recent) == set(recent[:2])
        assert len(counting.pages_read) == 1


def write_old_record(store: MetadataStore, name: str, ledgers: int) -> list[list[int]]:
    """A stream as software before paged streams stored it: one format-1 znode holding every ledger."""
    rows, offset = [], 0
    for ledger_id in range(FIRST_ID, FIRST_ID + ledgers):
        rows.append([ledger_id, offset, offset + rows_of(ledger_id) - 1])
        offset += rows_of(ledger_id)
    record = {
        "format_version": 1, "kind": "stream", "name": name, "format": "arrow", "schema": "", "ledgers": rows,
        "commits": {"query-1": 41}, "jobs": [["job-1", "committed"]], "base_offset": 0, "owner": "",
        "created_at": 1.0,
    }
    data = json.dumps(record, sort_keys=True).encode()
    assert len(data) < OLD_LAYOUT_LIMIT
    store.create(layout.stream_path(name), data)
    return rows


def test_an_old_single_znode_stream_is_read_and_migrated_page_by_page(store):
    old_ledgers = 35_000   # about 1 MB, close to the old wall: the first migrating multi must stay under it
    rows = write_old_record(store, "events", old_ledgers)
    old = [StreamLedger(*row) for row in rows]

    head = streams.read_stream(store, "events").value
    assert list(streams.iter_ledgers(store, head)) == old and head.committed_batch("query-1") == 41
    assert head.first_offset == 0 and head.next_offset == old[-1].last_offset + 1

    writes, next_id = 0, FIRST_ID + old_ledgers
    while len(head.tail) > PAGE_LEDGERS + 10:
        before = len(streams.list_pages(store, "events"))
        ids = range(next_id, next_id + 10)
        head = streams.update_stream(store, "events", lambda r: appended(r, ids)).value
        next_id += 10
        writes += 1
        sealed = len(streams.list_pages(store, "events")) - before
        assert sealed == PAGES_PER_UPDATE or len(head.tail) <= PAGE_LEDGERS + 10
        everything = list(streams.iter_ledgers(store, head))
        assert everything[:old_ledgers] == old   # offsets unchanged while the record moves into pages
        check_contiguous(everything)
    assert writes == pytest.approx(old_ledgers / (PAGE_LEDGERS * PAGES_PER_UPDATE), abs=2)
    head_size, page_sizes = znode_sizes(store, "events")
    assert head_size < HEAD_LIMIT and max(page_sizes.values()) < ZNODE_LIMIT
    assert head.committed_batch("query-1") == 41 and head.jobs == (("job-1", "committed"),)


SCHEMA = pa.schema([("a", pa.int64())])


def test_overwrites_keep_offsets_growing_and_drop_the_replaced_pages_and_ledgers(store):
    streams.create_stream(store, new_stream("events"))
    for start in range(0, 1000, BATCH):
        tasks = [TaskLedger(p, FIRST_ID + start + p, rows_of(FIRST_ID + start + p), 1) for p in range(BATCH)]
        streams.update_stream(store, "events", lambda r: committed(r, tasks, SCHEMA, overwrite=False))
    before = streams.read_stream(store, "events").value
    assert streams.live_pages(store, before)
    end = before.next_offset

    after = streams.update_stream(
        store, "events", lambda r: committed(r, [TaskLedger(0, 7, 10, 1)], SCHEMA, overwrite=True)).value
    assert after.first_offset == end and after.tail == (StreamLedger(7, end, end + 9),)
    assert list(streams.iter_ledgers(store, after)) == list(after.tail)   # the old pages are not the stream's
    assert streams.held_ledgers(store, after, [FIRST_ID, FIRST_ID + 999, 7]) == {7}

    discarded = []
    streams.drop_below(store, before, after.first_offset, discarded.append, still_there=lambda: True)
    assert sorted(discarded) == list(range(FIRST_ID, FIRST_ID + 1000))
    assert streams.list_pages(store, "events") == []
    with pytest.raises(OffsetsGoneError, match="no longer all in its pages"):
        list(streams.iter_ledgers(store, before))   # a reader still planning on the old head is told

    emptied = streams.update_stream(store, "events", lambda r: committed(r, [], SCHEMA, overwrite=True)).value
    assert emptied.tail == () and emptied.first_offset == emptied.next_offset == end + 10
    later = streams.update_stream(
        store, "events", lambda r: committed(r, [TaskLedger(0, 8, 5, 1)], SCHEMA, overwrite=False)).value
    assert later.tail == (StreamLedger(8, end + 10, end + 14),) and later.first_offset == end + 10


def test_concurrent_commits_keep_offsets_contiguous_and_lose_nothing(store, metadata_uri):
    streams.create_stream(store, StreamRecord("events", "raw"))
    per_writer, batch = 200, 5
    errors = []

    def commit_batches(query: str, first_id: int) -> None:
        try:
            with MetadataStore(metadata_uri) as own:
                for n in range(per_writer):
                    ids = range(first_id + n * batch, first_id + (n + 1) * batch)

                    def transform(record: StreamRecord) -> streams.Rewrite:
                        commit = read_query_commit(own, record, query)   # the query's record, in the multi
                        head, writes = committing(appended(record, ids), commit, n)
                        return streams.Rewrite(head, also=writes)

                    streams.update_stream(own, "events", transform)
        except Exception as exc:   # reported below
            errors.append(exc)

    writers = [threading.Thread(target=commit_batches, args=(f"q{k}", k * 1_000_000)) for k in (1, 2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(300)
    assert not errors

    head = streams.read_stream(store, "events").value
    ledgers = list(streams.iter_ledgers(store, head))
    offset = 0
    for ledger in ledgers:
        assert ledger.first_offset == offset
        offset = ledger.last_offset + 1
    for k in (1, 2):
        mine = [s.ledger_id for s in ledgers if k * 1_000_000 <= s.ledger_id < (k + 1) * 1_000_000]
        assert mine == list(range(k * 1_000_000, k * 1_000_000 + per_writer * batch))   # each batch once, in order
    assert dict(query_commits(store, head)) == {"q1": per_writer - 1, "q2": per_writer - 1} and head.commits == ()
    assert len(streams.list_pages(store, "events")) == (2 * per_writer * batch - len(head.tail)) // PAGE_LEDGERS


def test_deleting_a_stream_deletes_its_pages_and_a_new_one_starts_clean(store):
    build_history(store, "events", ledgers=3 * PAGE_LEDGERS)
    assert streams.list_pages(store, "events")
    delete_head(store, "events")
    assert streams.find_stream(store, "events") is None and not store.exists(layout.stream_books_path("events"))
    streams.create_stream(store, StreamRecord("events", "raw"))
    assert streams.list_pages(store, "events") == [] and streams.read_stream(store, "events").value.next_offset == 0


@pytest.mark.parametrize("at_start", [True, False], ids=["at-offset-0", "mid-stream"])
def test_a_page_of_empty_ledgers_only_leaves_the_stream_readable(store, at_start):
    """Helper audit 2026-11-29 finding 3: a stream writer opened and closed without an append leaves an empty ledger
    (offsets F..F-1). A page sealed of PAGE_LEDGERS of them covers no offset: at offset 0 its name, 0--1-M, could not
    be parsed, and elsewhere it sorted after or before the page starting at the same offset by ZooKeeper's order of
    children, so that every read below the tail failed with OffsetsGoneError in one of the two orders."""
    streams.create_stream(store, StreamRecord("s", "raw"))
    ids = iter(range(FIRST_ID, FIRST_ID + 10 * PAGE_LEDGERS))
    if not at_start:
        streams.update_stream(store, "s", lambda r: appended(r, [next(ids) for _ in range(PAGE_LEDGERS)]))

    def empty(record):
        offset = record.next_offset
        return record.replace(tail=record.tail + tuple(StreamLedger(next(ids), offset, offset - 1)
                                                       for _ in range(PAGE_LEDGERS)))

    streams.update_stream(store, "s", empty)
    for _ in range(3):   # enough after them that both pages are sealed off the tail
        streams.update_stream(store, "s", lambda r: appended(r, [next(ids) for _ in range(PAGE_LEDGERS)]))
    record = streams.read_stream(store, "s").value
    empty_pages = [page for page in streams.list_pages(store, "s") if page.last_offset < page.first_offset]
    assert len(empty_pages) == 1
    expected = [(l.ledger_id, l.first_offset, l.last_offset) for l in streams.iter_ledgers(store, record)]
    for order in (sorted, lambda found: sorted(found, reverse=True)):   # both orders ZooKeeper may list them in
        listed = store.children

        def children(path, listed=listed, order=order):
            return order(listed(path))

        store.children = children
        try:
            found = [(l.ledger_id, l.first_offset, l.last_offset) for l in streams.iter_ledgers(store, record)]
        finally:
            store.children = listed
        assert found == expected
    non_empty = [l for l in expected if l[2] >= l[1]]
    assert [l[1] for l in non_empty] == sorted(l[1] for l in non_empty)
    assert sum(l[2] - l[1] + 1 for l in non_empty) == record.next_offset - record.first_offset
