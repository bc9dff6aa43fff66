"""Pure decisions over a stream's sealed pages and books; metadata/streams.py does the ZooKeeper I/O.

A stream's pages are in books (/streams/NAME/books/K-F-P/F-L-M[-G]); a stream paged by software before books
also has flat pages (/streams/NAME/pages/F-L-M[-G]), all below its first book's offsets, as that software
stopped sealing before the first book was made. The flat pages and each book are a region: the pages one
listing returns. Book names say their regions' offsets (a book holds its stream's offsets from its first offset
up to the next book's, the newest up to the tail), so a reader lists the books, then only the regions that hold
the offsets it reads; pages never straddle two regions (a compaction's rewrite breaks its pages at region
boundaries), so each region's pages are chosen (current) and checked for gaps (covering) on their own.
"""
from __future__ import annotations

import bisect
import dataclasses
from typing import Iterable

from metadata.model import StreamBook, StreamPage


@dataclasses.dataclass(frozen=True)
class Region:
    """The pages of one book, or the flat pages (book None): they hold the stream's offsets from first_offset
    (None: from its start) to end - 1 (None: up to the tail)."""

    book: StreamBook | None
    first_offset: int | None
    end: int | None

    def clamp(self, lo: int, hi: int) -> tuple[int, int]:
        """lo..hi narrowed to this region's offsets (empty, lo > hi, if they do not meet)."""
        if self.first_offset is not None:
            lo = max(lo, self.first_offset)
        if self.end is not None:
            hi = min(hi, self.end - 1)
        return lo, hi


def regions(books: Iterable[StreamBook]) -> list[Region]:
    """The stream's regions in offset order: the flat pages, then its books by ordinal (a book's first offset is
    never below an older one's: books are made at the tail, and offsets only grow)."""
    books = sorted(books, key=lambda book: book.ordinal)
    ends = [book.first_offset for book in books[1:]] + [None]
    return [Region(None, None, books[0].first_offset if books else None)] + [
        Region(book, book.first_offset, end) for book, end in zip(books, ends)]


def regions_between(books: Iterable[StreamBook], lo: int, hi: int) -> list[Region]:
    """The regions holding offsets of lo..hi, in offset order; none if lo > hi."""
    return [region for region in regions(books) if _meets(region, lo, hi)] if lo <= hi else []


def _meets(region: Region, lo: int, hi: int) -> bool:
    first, last = region.clamp(lo, hi)
    return first <= last


def regions_holding(books: Iterable[StreamBook], low_id: int, lo: int, everywhere: bool = False) -> list[Region]:
    """Newest first, the regions with offsets from lo on that may hold a ledger with an id of low_id or more that
    came off the tail (every ledger a commit or a stream writer adds): the newest book, and each older region
    while the book after it was created with a P of low_id or more (no such ledger was sealed into the regions
    before a book whose P is lower: it was sealed after its id was allocated). A compaction's new ledgers are
    put into the old regions they rewrite: everywhere=True takes every region from lo on for them."""
    found = []
    listed = regions(books)
    for at in reversed(range(len(listed))):
        region = listed[at]
        if region.end is not None and region.end <= lo:
            break   # wholly below lo, as are all before it
        if at + 1 < len(listed) and not everywhere and listed[at + 1].book.max_ledger_id < low_id:
            break
        found.append(region)
    return found


def sort_pages(pages: Iterable[StreamPage]) -> list[StreamPage]:
    """In offset order. A page of empty ledgers only (F..F-1) comes before the page that starts at the same
    offset F."""
    return sorted(pages, key=lambda page: (page.first_offset, page.last_offset, page.generation))


def current(pages: list[StreamPage], generation: int) -> list[StreamPage]:
    """Of pages (in offset order), those a head of page_generation `generation` reads: the pages up to that
    generation that no page of a higher one overlaps. A rewrite covers exactly the offsets of the pages it
    replaces, so a page is either hidden whole or not at all."""
    if all(page.generation == 0 for page in pages):
        return pages
    # A page of empty ledgers only covers no offset (F..F-1): which rewrite replaced it cannot be told from offsets,
    # and a reader needs none of its ledgers, so with rewrites about it is left out.
    pages = [page for page in pages if page.last_offset >= page.first_offset]
    starts: list[int] = []
    chosen: list[StreamPage] = []
    for page in sorted((p for p in pages if p.generation <= generation), key=lambda p: -p.generation):
        at = bisect.bisect_left(starts, page.first_offset)
        if (at > 0 and chosen[at - 1].last_offset >= page.first_offset) or (
                at < len(chosen) and chosen[at].first_offset <= page.last_offset):
            continue  # replaced by a newer generation
        starts.insert(at, page.first_offset)
        chosen.insert(at, page)
    return chosen


def covering(pages: list[StreamPage], generation: int, lo: int, hi: int) -> list[StreamPage] | None:
    """The pages (of one region, in offset order) a head of page_generation `generation` reads for offsets
    lo..hi (lo <= hi): the current ones that overlap them. None if they do not cover lo..hi without a gap (pages
    deleted after the head was read: an overwrite or a truncation landed meanwhile, or a compaction's grace
    passed)."""
    chosen = [page for page in current(pages, generation) if _touches(page, lo, hi)]
    if not chosen or chosen[0].first_offset > lo or chosen[-1].last_offset < hi:
        return None
    if any(b.first_offset != a.last_offset + 1 for a, b in zip(chosen, chosen[1:])):
        return None
    return chosen


def _touches(page: StreamPage, lo: int, hi: int) -> bool:
    """Whether the page holds offsets of lo..hi; a page of empty ledgers only (F..F-1) does when F is in
    lo..hi + 1, so that one at a region's start or end is read with the region."""
    low, high = sorted((page.first_offset, page.last_offset))
    return high >= lo and low <= hi
