"""Books of stream pages (metadata/streams.py, metadata/paging.py) against a real ZooKeeper: a read below the tail
lists the book names and the books holding its offsets, so what it lists and reads does not grow with the
stream's pages; compactions rewrite within books, truncations delete emptied books, a stream paged by software
before books keeps reading its flat pages, and random histories read back as a simple model says.

Pages of 4 ledgers in books of 4 pages (16 ledgers a book) instead of 256 and 1,024: the same paging, fast.
Histories are built through the metadata API with made-up ledger ids: no ledger is written.
"""
import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connector.compaction import Candidate, CompactionPolicy, runs_of
from metadata import layout, serde, streams
from metadata.errors import OffsetsGoneError
from metadata.model import StreamLedger, StreamRecord
from metadata.store import MetadataStore
from metadata.streams import RunChangedError, replace_run

PAGE, BOOK = 4, 4
FIRST_ID = 1_000_000
NEW_ID = 9_000_000   # a compaction's ledgers are created after the run's


@pytest.fixture(autouse=True)
def small_pages(monkeypatch):
    monkeypatch.setattr(streams, "PAGE_LEDGERS", PAGE)
    monkeypatch.setattr(streams, "BOOK_PAGES", BOOK, raising=False)   # raising=False: runs on code before books


def rows_of(ledger_id: int) -> int:
    return 1 + ledger_id % 3


def appended(record: StreamRecord, ledger_ids) -> StreamRecord:
    """record with closed ledgers appended at its next offset, as a commit adds its task ledgers."""
    offset, added = record.next_offset, []
    for ledger_id in ledger_ids:
        added.append(StreamLedger(ledger_id, offset, offset + rows_of(ledger_id) - 1))
        offset += rows_of(ledger_id)
    return record.replace(tail=record.tail + tuple(added))


def build(store: MetadataStore, name: str, ledgers: int, first_id: int = FIRST_ID, batch: int = 8) -> StreamRecord:
    """A raw stream of `ledgers` closed ledgers committed `batch` at a time; its head after."""
    streams.update_stream(store, name, lambda r: r, create=StreamRecord(name, "raw"))
    for start in range(0, ledgers, batch):
        ids = range(first_id + start, first_id + min(start + batch, ledgers))
        streams.update_stream(store, name, lambda r: appended(r, ids))
    return streams.read_stream(store, name).value


class Counting:
    """Counts, while installed on a store, its listings of a stream's pages and books (calls, and the names
    they returned: book names apart from page names) and its reads of page znodes."""

    def __init__(self, store: MetadataStore):
        self.store = store
        self.listings = self.book_names = self.page_names = self.pages_read = 0
        self.listed: list[str] = []

    def __enter__(self):
        children, read = self.store.children, self.store.read

        def counted_children(path):
            listed = children(path)
            self.listed.append(path)
            if path.endswith("/books"):
                self.listings += 1
                self.book_names += len(listed)
            elif path.endswith("/pages") or "/books/" in path:
                self.listings += 1
                self.page_names += len(listed)
            return listed

        def counted_read(path, decode):
            self.pages_read += "/pages/" in path or "/books/" in path
            return read(path, decode)

        self.store.children, self.store.read = counted_children, counted_read
        return self

    def __exit__(self, *exc):
        del self.store.children, self.store.read   # the class's methods again

    @property
    def figures(self) -> tuple[int, int, int, int]:
        return self.listings, self.book_names, self.page_names, self.pages_read


def test_a_read_below_the_tail_lists_and_reads_the_same_however_many_books_the_stream_has(store):
    """10 and 100 books' worth of pages (40 and 400): a read deep below the tail, a read just below it and the
    membership of recent ledgers list and read exactly as much in both, but for one book name per book. (Before
    books, each listed every page name: 40, then 400.)"""
    figures = {}
    for books in (10, 100):
        name = f"s{books}"
        head = build(store, name, books * BOOK * PAGE + 2, batch=BOOK * PAGE)
        everything = list(streams.iter_ledgers(store, head))
        pages = len(streams.list_pages(store, name))
        assert pages >= books * BOOK
        deep = everything[len(everything) // 2]
        recent = head.tail[0].ledger_id - 1   # sealed by the last commit
        reads = {
            "deep": lambda: list(streams.iter_ledgers(store, head, deep.first_offset, deep.last_offset + 5)),
            "below the tail": lambda: list(streams.iter_ledgers(store, head, head.tail_offset - 3)),
            "held": lambda: streams.held_ledgers(store, head, [recent, head.tail[-1].ledger_id]),
        }
        for what, read in reads.items():
            with Counting(store) as counting:
                found = read()
            assert found, what
            figures[books, what] = counting.figures
        print(f"\n{books} books ({pages} pages): (listings, book names, page names, pages read) per read: " +
              ", ".join(f"{what} {figures[books, what]}" for what in reads))
    for what in ("deep", "below the tail", "held"):
        listings, book_names, page_names, pages_read = figures[100, what]
        assert (listings, page_names, pages_read) == (figures[10, what][0], figures[10, what][2],
                                                        figures[10, what][3]), what
        assert listings <= 3 and page_names <= 2 * BOOK and pages_read <= 3, what
        assert book_names <= 101, what   # one name per book (a book of 1,024 pages: 262,144 ledgers)


def test_books_hold_a_bounded_number_of_pages_and_their_names_tell_their_offsets_and_ids(store):
    head = build(store, "s", 10 * BOOK * PAGE + 3)
    books = sorted(streams.list_books(store, "s"), key=lambda book: book.ordinal)
    assert [book.ordinal for book in books] == list(range(10))
    pages = streams.list_pages(store, "s")
    for book, after in zip(books, books[1:] + [None]):
        mine = [page for page in pages if page.book == book]
        assert len(mine) == BOOK and mine[0].first_offset == book.first_offset
        if after is not None:
            assert mine[-1].last_offset + 1 == after.first_offset
            assert after.max_ledger_id == max(page.max_ledger_id for page in pages if page.book.ordinal <= book.ordinal)
    assert books[0].max_ledger_id == -1
    assert head.shelf.book is None and head.shelf.next_ordinal == 10   # the last book is full: the next page starts one
    grown = streams.update_stream(store, "s", lambda r: appended(r, range(FIRST_ID + 500, FIRST_ID + 510))).value
    assert grown.shelf.book.ordinal == 10 and grown.shelf.pages >= 1
    assert serde.decode_stream(serde.encode_stream(grown)) == grown


def test_a_compaction_rewrites_within_books_and_across_a_book_boundary(store):
    head = build(store, "s", 4 * BOOK * PAGE + 10)
    before = list(streams.iter_ledgers(store, head))
    starts = streams.book_starts(store, head)
    boundary = starts[1]   # where the third book starts
    at = next(n for n, ledger in enumerate(before) if ledger.first_offset == boundary)
    run = tuple(before[at - 6:at + 5])
    straddling = (StreamLedger(NEW_ID, run[0].first_offset, run[-1].last_offset),)
    with pytest.raises(RunChangedError, match="two books"):
        streams.update_stream(store, "s", lambda h: replace_run(store, h, run, straddling))

    by = (StreamLedger(NEW_ID, run[0].first_offset, boundary - 1), StreamLedger(NEW_ID + 1, boundary,
                                                                                run[-1].last_offset))
    after = streams.update_stream(store, "s", lambda h: replace_run(store, h, run, by)).value
    expected = before[:at - 6] + list(by) + before[at + 5:]
    assert list(streams.iter_ledgers(store, after)) == expected
    assert list(streams.iter_ledgers(store, head)) == before   # a reader of the head before the swap
    rewritten = [page for page in streams.live_pages(store, after) if page.generation == 1]
    assert {page.book.first_offset for page in rewritten} == {starts[0], boundary}
    assert all(p.last_offset < boundary for p in rewritten if p.book.first_offset == starts[0])
    # ranges on either side of the boundary read the new ledgers
    assert list(streams.iter_ledgers(store, after, boundary - 1, boundary)) == list(by)
    # the new ledgers are where they went (a compaction's: looked for in every book); a replaced one is gone
    assert streams.held_ledgers(store, after, [NEW_ID, NEW_ID + 1], rewritten=True) == {NEW_ID, NEW_ID + 1}
    assert streams.held_ledgers(store, after, [run[0].ledger_id, before[-1].ledger_id]) == {before[-1].ledger_id}

    # The compaction deletes the replaced pages after its grace (by the names its record keeps).
    rewrite = replace_run(store, head, run, by)
    for page in rewrite.replaced:
        store.delete(layout.page_ref_path("s", layout.page_ref(page)))
    assert list(streams.iter_ledgers(store, after)) == expected
    with pytest.raises(OffsetsGoneError):
        list(streams.iter_ledgers(store, head, boundary, boundary))


def test_a_plan_breaks_its_runs_where_books_start():
    candidates = [Candidate(StreamLedger(n, 10 * n, 10 * n + 9), 10, (3, 3, 2)) for n in range(10)]
    runs = runs_of(candidates, CompactionPolicy(target_bytes=1000), breaks=[40, 70])
    assert [[c.ledger.ledger_id for group in run for c in group] for run in runs] == [[0, 1, 2, 3], [4, 5, 6],
                                                                                     [7, 8, 9]]


def test_truncations_delete_the_books_they_empty_and_a_stream_cut_whole_starts_a_new_book(store):
    head = build(store, "s", 5 * BOOK * PAGE + 3)
    books = sorted(streams.list_books(store, "s"), key=lambda book: book.ordinal)
    cut = books[2].first_offset + 5   # inside the third book
    before, everything = head, list(streams.iter_ledgers(store, head))
    head = streams.update_stream(store, "s", lambda r: r.replace(first_offset=cut)).value
    discarded = []
    streams.drop_below(store, before, cut, discarded.append, still_there=lambda: True)
    assert sorted(discarded) == [ledger.ledger_id for ledger in everything if ledger.last_offset < cut]
    left = sorted(streams.list_books(store, "s"), key=lambda book: book.ordinal)
    assert left == books[2:]
    assert all(page.last_offset >= cut for page in streams.list_pages(store, "s"))
    assert list(streams.iter_ledgers(store, head)) == [s for s in everything if s.last_offset >= cut]
    with pytest.raises(OffsetsGoneError):   # a reader of the head before the cut, below it
        list(streams.iter_ledgers(store, before, books[1].first_offset, books[1].first_offset))

    # A cut of every paged offset: the books go, and the next page starts a new book (its ordinal never reused).
    before = head
    everything = head.tail[-1].first_offset   # all but the last ledger
    head = streams.update_stream(store, "s", lambda r: r.replace(first_offset=everything, tail=r.tail[-1:])).value
    streams.drop_below(store, before, everything, discarded.append, still_there=lambda: True)
    assert streams.list_books(store, "s") == [] and head.shelf.book is None
    head = streams.update_stream(store, "s", lambda r: appended(r, range(FIRST_ID + 900, FIRST_ID + 910))).value
    (book,) = streams.list_books(store, "s")
    assert book.ordinal == books[-1].ordinal + 1 and book.first_offset >= everything
    assert [ledger.ledger_id for ledger in streams.iter_ledgers(store, head)] == \
        [before.tail[-1].ledger_id] + list(range(FIRST_ID + 900, FIRST_ID + 910))


def test_a_page_or_book_deleted_meanwhile_is_offsets_gone_not_fewer_ledgers(store):
    head = build(store, "s", 3 * BOOK * PAGE + 3)
    pages = streams.live_pages(store, head)
    middle = pages[len(pages) // 2]
    store.delete(layout.stream_page_path("s", middle))
    with pytest.raises(OffsetsGoneError):
        list(streams.iter_ledgers(store, head))
    with pytest.raises(OffsetsGoneError):
        list(streams.iter_ledgers(store, head, middle.first_offset, middle.first_offset))
    assert list(streams.iter_ledgers(store, head, pages[0].first_offset, pages[0].last_offset))   # elsewhere: fine
    first_book = pages[0].book
    store.delete(layout.stream_book_path("s", first_book), recursive=True)
    with pytest.raises(OffsetsGoneError):
        list(streams.iter_ledgers(store, head, pages[0].first_offset, pages[0].first_offset))


def old_layout(store: MetadataStore, name: str, ledgers: int) -> tuple[StreamRecord, list[StreamLedger]]:
    """A stream as software before books left it: a format-3 head (no shelf) and flat pages /pages/F-L-M."""
    offset, all_ledgers = 0, []
    for ledger_id in range(FIRST_ID, FIRST_ID + ledgers):
        all_ledgers.append(StreamLedger(ledger_id, offset, offset + rows_of(ledger_id) - 1))
        offset += rows_of(ledger_id)
    paged = len(all_ledgers) // PAGE * PAGE - PAGE
    head = StreamRecord(name, "raw", tail=tuple(all_ledgers[paged:]), created_at=1.0)
    record = json.loads(serde.encode_stream(head))
    record["format_version"] = 3
    store.create(layout.stream_path(name), json.dumps(record).encode())
    for directory in (layout.stream_pages_path(name), layout.stream_queries_path(name), layout.stream_cuts_path(name)):
        store.create(directory)
    for start in range(0, paged, PAGE):
        run = tuple(all_ledgers[start:start + PAGE])
        page = f"{run[0].first_offset}-{run[-1].last_offset}-{run[-1].ledger_id}"
        store.create(f"{layout.stream_pages_path(name)}/{page}", serde.encode_page(run))
    return streams.read_stream(store, name).value, all_ledgers


def test_a_stream_with_flat_pages_keeps_reading_and_seals_new_pages_into_books(store):
    head, old = old_layout(store, "s", 10 * PAGE + 2)
    assert head.shelf is None and not store.exists(layout.stream_books_path("s"))
    assert list(streams.iter_ledgers(store, head)) == old
    assert list(streams.iter_ledgers(store, head, old[13].first_offset, old[17].last_offset)) == old[13:18]
    assert streams.held_ledgers(store, head, [old[3].ledger_id, old[-1].ledger_id]) == {old[3].ledger_id,
                                                                                       old[-1].ledger_id}

    new_ids = range(FIRST_ID + 100, FIRST_ID + 140)
    head = streams.update_stream(store, "s", lambda r: appended(r, new_ids)).value
    everything = list(streams.iter_ledgers(store, head))
    assert everything[:len(old)] == old and [s.ledger_id for s in everything[len(old):]] == list(new_ids)
    books = sorted(streams.list_books(store, "s"), key=lambda book: book.ordinal)
    flat_pages = store.children(layout.stream_pages_path("s"))
    assert books and books[0].max_ledger_id == max(layout.page_from_name(page).max_ledger_id for page in flat_pages)
    assert len(flat_pages) == (10 * PAGE + 2) // PAGE - 1   # where they were: not moved
    # A read above the flat pages does not list them; one across the boundary reads both.
    with Counting(store) as counting:
        found = list(streams.iter_ledgers(store, head, everything[-20].first_offset, everything[-15].last_offset))
    assert found == everything[-20:-14] and not any(path.endswith("/pages") for path in counting.listed)
    boundary = books[0].first_offset
    across = [ledger for ledger in everything if ledger.last_offset >= boundary - 3 and
              ledger.first_offset <= boundary + 3]
    assert list(streams.iter_ledgers(store, head, boundary - 3, boundary + 3)) == across
    # Membership: a flat page's ledger (its id is below the first book's P) and a recent one.
    assert streams.held_ledgers(store, head, [old[2].ledger_id, FIRST_ID + 139, 42]) == {old[2].ledger_id,
                                                                                         FIRST_ID + 139}

    # A compaction of flat pages rewrites them flat; a truncation deletes them.
    run = tuple(old[1:9])
    by = (StreamLedger(NEW_ID, run[0].first_offset, run[-1].last_offset),)
    compacted = streams.update_stream(store, "s", lambda h: replace_run(store, h, run, by)).value
    assert list(streams.iter_ledgers(store, compacted)) == everything[:1] + list(by) + everything[9:]
    assert any(layout.page_from_name(page).generation == 1 for page in store.children(layout.stream_pages_path("s")))
    cut = boundary + 1
    truncated = streams.update_stream(store, "s", lambda r: r.replace(first_offset=cut)).value
    streams.drop_below(store, compacted, cut, lambda ledger_id: None, still_there=lambda: True)
    assert store.children(layout.stream_pages_path("s")) == []
    assert list(streams.iter_ledgers(store, truncated)) == [s for s in everything if s.last_offset >= cut]


# -- random histories against a model ------------------------------------------------------------------

_streams = itertools.count()
operation = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 24)),
    st.tuples(st.just("compact"), st.integers(0, 10_000), st.integers(2, 12), st.booleans()),
    st.tuples(st.just("truncate"), st.integers(0, 10_000)),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(operation, min_size=1, max_size=20))
def test_random_seals_compactions_and_truncations_read_back_as_the_model_says(store, operations):
    name = f"m{next(_streams)}"
    streams.create_stream(store, StreamRecord(name, "raw"))
    model: list[StreamLedger] = []   # the stream's ledgers, in offset order
    issued: list[int] = []           # the ledger ids appended
    compacted_ids = itertools.count(NEW_ID)
    for op in operations:
        head = streams.read_stream(store, name).value
        if op[0] == "append":
            ids = list(range(FIRST_ID + len(issued), FIRST_ID + len(issued) + op[1]))
            issued += ids
            model = model + list(appended(head, ids).tail[len(head.tail):])
            head = streams.update_stream(store, name, lambda r: appended(r, ids)).value
        elif op[0] == "compact" and len(model) > 2:
            start = op[1] % (len(model) - 2)
            run = tuple(model[start:min(start + op[2], len(model) - 1)])
            if len(run) < 2:
                continue
            cuts = [s for s in streams.book_starts(store, head) if run[0].first_offset < s <= run[-1].last_offset]
            if op[3]:   # and one more ledger boundary, within a book
                cuts = sorted(set(cuts) | {run[len(run) // 2].first_offset})
            bounds = [run[0].first_offset] + cuts + [run[-1].last_offset + 1]
            by = tuple(StreamLedger(next(compacted_ids), a, b - 1) for a, b in zip(bounds, bounds[1:]))
            old_head, old_model = head, model
            head = streams.update_stream(store, name, lambda h: replace_run(store, h, run, by)).value
            model = model[:start] + list(by) + model[start + len(run):]
            assert list(streams.iter_ledgers(store, old_head)) == old_model   # replaced pages stay for the grace
        elif op[0] == "truncate" and model:
            cut = model[op[1] % len(model)].first_offset
            if cut <= head.first_offset:
                continue
            before = head
            head = streams.update_stream(store, name, lambda r: r.replace(
                first_offset=cut, tail=tuple(s for s in r.tail if s.last_offset >= cut))).value
            streams.drop_below(store, before, cut, lambda ledger_id: None, still_there=lambda: True)
            model = [ledger for ledger in model if ledger.last_offset >= cut]
        assert list(streams.iter_ledgers(store, head)) == model, op
        if model:
            lo = model[len(model) // 3].first_offset
            hi = model[2 * len(model) // 3].last_offset
            assert list(streams.iter_ledgers(store, head, lo, hi)) == [s for s in model if s.last_offset >= lo and
                                                                       s.first_offset <= hi]
        held = {s.ledger_id for s in model}
        asked = issued + [FIRST_ID + len(issued)]   # every id appended, and one not yet
        assert streams.held_ledgers(store, head, asked) == held - {i for i in held if i >= NEW_ID}
        assert streams.held_ledgers(store, head, asked + sorted(held), rewritten=True) == held
