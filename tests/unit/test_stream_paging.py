"""The pure decisions over a stream's pages and books (metadata/paging.py): which regions a read of offsets lists,
which may hold given ledger ids, which pages a head reads and when they leave a gap."""
from hypothesis import given
from hypothesis import strategies as st

from metadata.model import StreamBook, StreamPage
from metadata.paging import Region, covering, current, regions, regions_between, regions_holding

BOOKS = [StreamBook(2, 300, 3000), StreamBook(0, 100, -1), StreamBook(1, 200, 2000)]   # listed in no order


def test_regions_are_the_flat_pages_then_the_books_by_ordinal_each_up_to_the_next():
    assert regions(BOOKS) == [Region(None, None, 100), Region(BOOKS[1], 100, 200), Region(BOOKS[2], 200, 300),
                              Region(BOOKS[0], 300, None)]
    assert regions([]) == [Region(None, None, None)]   # a stream before books: its flat pages hold everything


def test_a_read_lists_only_the_regions_holding_its_offsets():
    def between(lo, hi):
        return [region.book.ordinal if region.book else "flat" for region in regions_between(BOOKS, lo, hi)]
    assert between(150, 160) == [0]
    assert between(199, 200) == [0, 1]
    assert between(250, 10_000) == [1, 2]
    assert between(50, 120) == ["flat", 0]
    assert between(160, 150) == []


@given(st.lists(st.integers(0, 50), min_size=0, max_size=8), st.integers(0, 60), st.integers(0, 60))
def test_the_regions_chosen_are_exactly_those_whose_offsets_meet_the_range(gaps, lo, hi):
    starts, offset = [], 0
    for gap in gaps:
        offset += gap
        starts.append(offset)
    books = [StreamBook(n, start, n) for n, start in enumerate(starts)]
    chosen = regions_between(books, lo, hi)
    for region in regions(books):
        first = -1 if region.first_offset is None else region.first_offset
        end = 10_000 if region.end is None else region.end
        assert (region in chosen) == (lo <= hi and any(first <= x < end for x in range(lo, hi + 1)))


def test_membership_looks_at_the_newest_book_and_back_while_a_newer_book_was_made_with_a_higher_id():
    def holding(low_id, lo=0, everywhere=False):
        return [r.book.ordinal if r.book else "flat" for r in regions_holding(BOOKS, low_id, lo, everywhere)]
    assert holding(3001) == [2]                     # sealed after the newest book was made
    assert holding(2500) == [2, 1]                  # book 1 holds ids up to 3000 (book 2's P)
    assert holding(1500) == [2, 1, 0]
    assert holding(0) == [2, 1, 0]                  # the flat pages held no ledger (book 0's P is -1)
    assert holding(0, lo=250) == [2, 1]             # book 0 is wholly below offset 250
    assert holding(3001, everywhere=True) == [2, 1, 0, "flat"]   # a compaction's ledger: anywhere
    assert [r.book for r in regions_holding([], 5, 0)] == [None]


def page(first, last, max_id=1, generation=0):
    return StreamPage(first, last, max_id, generation)


def test_a_head_reads_the_pages_of_its_generation_and_a_gap_is_reported():
    pages = [page(0, 9), page(10, 19), page(10, 14, 5, 1), page(15, 19, 6, 1), page(20, 29)]
    assert current(pages, 0) == [page(0, 9), page(10, 19), page(20, 29)]
    assert current(pages, 1) == [page(0, 9), page(10, 14, 5, 1), page(15, 19, 6, 1), page(20, 29)]
    assert covering(pages, 1, 12, 22) == [page(10, 14, 5, 1), page(15, 19, 6, 1), page(20, 29)]
    assert covering(pages, 0, 12, 22) == [page(10, 19), page(20, 29)]
    gone = [p for p in pages if p != page(15, 19, 6, 1)]
    assert covering(gone, 1, 12, 22) is None         # the rewritten page was deleted: a gap, not fewer ledgers
    assert covering(gone, 1, 0, 12) == [page(0, 9), page(10, 14, 5, 1)]   # elsewhere the head still reads
    assert covering(pages, 0, 25, 35) is None        # the pages end before the range does
    assert covering(pages, 0, -5, 5) is None         # ... or start after it


def test_a_page_of_empty_ledgers_at_a_regions_start_or_end_is_read_with_it():
    # a book starting with one (its first page F..F-1), and one ending with one
    assert covering([page(100, 99), page(100, 109)], 0, 100, 109) == [page(100, 99), page(100, 109)]
    assert covering([page(90, 99), page(100, 99)], 0, 90, 99) == [page(90, 99), page(100, 99)]
