"""Streams: the head of a segmented log and the sealed pages that hold its older ledgers.

    /streams/NAME                 the head (StreamRecord): format, schema, owner, batch jobs' outcomes, first
                                  offset, where the next page is sealed (shelf), and the tail: the most recent
                                  ledgers, always including the last one
    /streams/NAME/books/K-F-P     a book: up to BOOK_PAGES pages sealed one after the other, from offset F
    /streams/NAME/books/K-F-P/F-L-M
                                  a sealed page: PAGE_LEDGERS closed ledgers covering offsets F..L, M the
                                  highest ledger id in it; immutable once created
    /streams/NAME/pages/F-L-M     a flat page, as software before books sealed them (read, never sealed again)
    /streams/NAME/queries/Q       streaming query Q's last committed batch (metadata/query_commits.py), set in
                                  the multi of the head's update that commits it

Every update goes through update_stream (find or create, transform the head, compare-and-set): the head's
CAS and the creation of the pages an overflowing tail is sealed into (and of the book a page starts) are one
ZooKeeper multi, so a job's or micro-batch's ledgers become visible in one step, and a commit writes the head
plus at most PAGES_PER_UPDATE pages (and a streaming commit its query's record) whatever the stream's history
(DESIGN rule 15). A head written by older software (every ledger in one record) is read as a head with a long
tail and sealed into pages over its next writes.
Offsets only grow (rule 17), so a page's name never comes back: pages below first_offset (after an
overwrite or a truncation) are skipped by readers and deleted by drop_below once their ledgers are, and a
book once its pages are.

Books keep every read's listing small (rule 15). A book's name K-F-P says where its offsets start (F; they end
where the next book's start), so a reader lists the book names (one per BOOK_PAGES * PAGE_LEDGERS ledgers) and
then only the books that hold the offsets it reads (metadata/paging.py chooses them). P, the highest ledger id
in the stream's pages when the book was made, tells held_ledgers which older books can still hold a ledger.
The head's shelf names the book the next page goes into and how full it is; the seal that fills a book's
last place leaves the next page to make a new one. A cut that takes every page off the stream (first_offset
reaches the tail) leaves the next page a new book as well, as drop_below deletes the emptied ones.
A stream paged by software before books keeps its flat pages where they are: they all hold offsets below its
first book's (that software refuses a head of format version 4), so only reads of those offsets list them.

A compaction replaces a contiguous run of closed ledgers by fewer, larger ones at the same offsets
(replace_run): in its one multi it sets the head (the run taken off the tail, page_generation up by one)
and creates the rewritten pages, named F-L-M-G with G that generation, covering exactly the offsets of the
pages they replace, in the same book (a new ledger across a book's end is refused). The replaced pages are
not deleted then: a reader that read the head before the swap may still list and read them, so a reader
whose head has page_generation g reads, for every offset, the page of the highest generation up to g
(live_pages), and sees the stream exactly as its head described it, with the replaced ledgers, which also
stay for the grace. The compaction deletes both after it.

Reads take the head (one znode), then iter_ledgers reads only the pages that overlap the offsets asked
for (none when the tail covers them), listing the book names and the books holding those offsets, and
held_ledgers only the pages that can hold the ledger ids asked for (a page's name carries its highest ledger
id; ledger ids grow, so these are the recent pages, in the newest books).
"""
from __future__ import annotations

import bisect
import dataclasses
import logging
import time
from typing import Callable, Iterable, Iterator

from kazoo.exceptions import (
    BadVersionError, ConnectionLoss, NodeExistsError, NoNodeError, NotEmptyError, OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError

from metadata import layout, paging, serde
from metadata.errors import (
    LedgerError, MetadataConflictError, MetadataError, NoSuchStreamError, OffsetsGoneError, StreamBeingDeletedError,
    StreamExistsError,
    ZooKeeperUnreachableError,
)
from metadata.model import Shelf, StreamBook, StreamLedger, StreamPage, StreamRecord, Versioned
from metadata.paging import Region
from metadata.store import ZK_WAIT_ENV, MetadataStore

log = logging.getLogger(__name__)

_NO_REPLY = (ConnectionLoss, SessionExpiredError, OperationTimeoutError, KazooTimeoutError)
# A page holds PAGE_LEDGERS ledgers (5-7 KiB); the head keeps at most PAGE_LEDGERS plus what one update added,
# and one update seals at most PAGES_PER_UPDATE pages. An old single-record stream (up to ZooKeeper's 1 MB,
# 35,000-50,000 ledgers) is thus paged over its next 17-25 writes, each multi smaller than the old record
# (the encoding is more compact), so none exceeds ZooKeeper's 1 MB request limit.
PAGE_LEDGERS = 256
PAGES_PER_UPDATE = 8
# A book holds BOOK_PAGES pages sealed off the tail (262,144 ledgers), plus the pages compactions rewrite in it
# while their grace lasts: a book's listing is some 30-40 KB of names, and a stream's book names grow by one per
# 262,144 ledgers.
BOOK_PAGES = 1024


class InvalidStreamNameError(LedgerError):
    """Stream names are 1-200 letters, digits, '_', '.', '-', starting with a letter or digit."""


class InvalidStreamFormatError(LedgerError):
    """The stream holds another format than the operation needs (raw payloads vs. Arrow batches)."""


class UpdateOutcomeUnknownError(MetadataError):
    """A stream update got no reply and ZooKeeper stayed out of reach, so whether it landed is not known."""


class RunChangedError(LedgerError):
    """The ledgers a compaction rewrote are no longer all in the stream at the same offsets (truncated,
    overwritten or compacted meanwhile): its new ledgers must not replace them."""


# (path, data, expected version: a compare-and-set; None: a create); data None: only a check that the znode is at
# that version (-1: that it exists), as a commit checks that its job's registry is still there.
ZnodeWrite = tuple[str, "bytes | None", "int | None"]


@dataclasses.dataclass(frozen=True)
class Rewrite:
    """A transform's result that changes more than the head in its multi: the multi sets head, creates pages (of
    generation head.page_generation, in the books they name: a compaction's, built by replace_run), and writes
    each znode of `also` that changes in the same step (path, data, expected version: a compare-and-set;
    version None: a create), such as a compaction's record or a streaming query's commit record. replaced are
    the pages the new ones hide: still readable by older heads, deleted after the caller's grace."""

    head: StreamRecord
    pages: tuple[tuple[StreamPage, tuple[StreamLedger, ...]], ...] = ()
    replaced: tuple[StreamPage, ...] = ()
    also: tuple[ZnodeWrite, ...] = ()


def check_stream_name(name: str) -> str:
    if not layout.is_name(name):
        raise InvalidStreamNameError(f"invalid stream name {name!r}: use {layout.NAME_RULE}")
    return name


def create_stream(store: MetadataStore, record: StreamRecord) -> Versioned[StreamRecord]:
    check_stream_name(record.name)
    record = record.replace(created_at=record.created_at or time.time(), shelf=record.shelf or Shelf())
    transaction = store.transaction()
    transaction.create(layout.stream_path(record.name), serde.encode_stream(record))
    transaction.create(layout.stream_books_path(record.name))
    transaction.create(layout.stream_queries_path(record.name))
    transaction.create(layout.stream_cuts_path(record.name))
    try:
        transaction.commit()
    except NodeExistsError as exc:
        found = find_stream(store, record.name, deleting=True)
        if found is not None and found.value.deleting:
            raise StreamBeingDeletedError(
                f"stream {record.name!r} is being deleted (`ledger stream delete` marked it and has not finished: "
                "run it again if it was stopped); write to it once it is gone") from exc
        raise StreamExistsError(f"stream {record.name!r} exists already") from exc
    return Versioned(record, 0)


def read_stream(store: MetadataStore, name: str) -> Versioned[StreamRecord]:
    """The stream's head (one znode): its tail, not its older ledgers (iter_ledgers reads those)."""
    found = find_stream(store, name)
    if found is None:
        raise _no_such_stream(name)
    return found


def find_stream(store: MetadataStore, name: str, *, deleting: bool = False) -> Versioned[StreamRecord] | None:
    """The stream's head, None if there is none, or (unless deleting=True) if `ledger stream delete` marked it
    deleting: to every reader and writer such a stream is gone already."""
    found = store.read(layout.stream_path(check_stream_name(name)), serde.decode_stream)
    if found is not None and found.value.deleting and not deleting:
        return None
    return found


def write_stream(
    store: MetadataStore, record: StreamRecord | Rewrite, expected_version: int
) -> Versioned[StreamRecord]:
    """Compare-and-set the head at expected_version; in the same multi, the oldest ledgers of a tail longer
    than PAGE_LEDGERS are sealed into new pages (and the books they start created; a Rewrite's pages are
    created and its `also` written). Returns the head as stored (its tail shortened so)."""
    rewrite = record if isinstance(record, Rewrite) else Rewrite(record)
    head = rewrite.head
    if head.shelf is None and _seals(head.tail):   # a head of older software: once, the highest id of its flat pages
        highest = max([_highest_flat_id(store, head.name)] + [page.max_ledger_id for page, _ in rewrite.pages])
        head = head.replace(shelf=Shelf(max_ledger_id=highest))
    head, books, pages = _sealed(head)
    pages = list(rewrite.pages) + pages
    try:
        version = _commit(store, head, expected_version, books, pages, rewrite.also)
    except NoNodeError as exc:
        if not store.exists(layout.stream_path(head.name)):
            raise NoSuchStreamError(f"stream {head.name!r} was deleted while being updated") from exc
        for path, _, also_version in rewrite.also:
            if also_version is not None and not store.exists(path):
                raise MetadataConflictError(f"{path} is gone; re-read and retry") from exc
        # A stream created before books (or query commit records, or cuts) existed: those directories come with
        # their first znode.
        for directory in (layout.stream_books_path(head.name), layout.stream_queries_path(head.name),
                          layout.stream_cuts_path(head.name)):
            create_directory(store, head.name, directory)
        try:
            version = _commit(store, head, expected_version, books, pages, rewrite.also)
        except NoNodeError as again:   # deleted meanwhile: the stream, or a znode of `also`
            raise MetadataConflictError(f"stream {head.name!r}: a znode of the update went; re-read") from again
    return Versioned(head, version)


def create_directory(store: MetadataStore, name: str, path: str) -> None:
    """Create a directory znode of the stream, unless there; never the stream's head (a stream deleted
    meanwhile is not brought back as an empty znode). A lost reply is read back (the create is sent again)."""
    try:
        store.create_unless_there(path)
    except NoNodeError as exc:
        raise NoSuchStreamError(f"stream {name!r} was deleted while being updated") from exc


def _commit(
    store: MetadataStore, head: StreamRecord, expected_version: int, books: list[StreamBook],
    pages: list[tuple[StreamPage, tuple]], also: tuple[ZnodeWrite, ...],
) -> int:
    """One multi: the head's CAS, the creation of the books, then of the pages, and `also`; returns the head's
    new version."""
    transaction = store.transaction()
    transaction.set_data(layout.stream_path(head.name), serde.encode_stream(head), expected_version)
    for book in books:
        transaction.create(layout.stream_book_path(head.name, book))
    for page, ledgers in pages:
        transaction.create(layout.stream_page_path(head.name, page), serde.encode_page(ledgers))
    for path, data, also_version in also:
        if also_version is None:
            transaction.create(path, data)
        elif data is None:
            transaction.check(path, also_version)
        else:
            transaction.set_data(path, data, also_version)
    try:
        return transaction.commit()[0].version
    except BadVersionError as exc:
        raise MetadataConflictError(
            f"stream {head.name!r} (or a znode written with its head) changed since it was read (expected head "
            f"version {expected_version}); re-read and retry"
        ) from exc
    except NodeExistsError as exc:
        created = [path for path, _, also_version in also if also_version is None and store.exists(path)]
        if created or not pages:
            raise MetadataConflictError(f"{created[0] if created else 'a znode'} was created meanwhile; re-read and "
                                        "retry") from exc
        raise MetadataError(
            f"stream {head.name!r}: a page for offsets {pages[0][0].first_offset}.. exists already, though the "
            "head does not list it; the stream's metadata was changed outside this software"
        ) from exc


def _seals(tail: tuple[StreamLedger, ...]) -> bool:
    """Whether a tail is long enough to seal a page off it, of closed ledgers."""
    return len(tail) > PAGE_LEDGERS and all(ledger.last_offset is not None for ledger in tail[:PAGE_LEDGERS])


def _sealed(
    record: StreamRecord,
) -> tuple[StreamRecord, list[StreamBook], list[tuple[StreamPage, tuple[StreamLedger, ...]]]]:
    """Pure: record with the oldest PAGE_LEDGERS-runs of its tail taken off into pages, while the tail is longer
    than PAGE_LEDGERS (it keeps at least its last ledger; only closed ledgers are sealed), at most
    PAGES_PER_UPDATE of them; and the books to create for them. A page goes into the shelf's book, or starts a
    new one when there is none (the last one is full, or the stream has none yet). A head whose offsets are all
    in its tail (a cut took every page) starts a new book with its next page: drop_below deletes the old ones
    once their pages are gone."""
    shelf = record.shelf
    if shelf is not None and shelf.book is not None and record.first_offset >= record.tail_offset:
        shelf = dataclasses.replace(shelf, book=None, pages=0)
    tail = record.tail
    books, pages = [], []
    while _seals(tail) and len(pages) < PAGES_PER_UPDATE:
        run = tail[:PAGE_LEDGERS]
        if shelf.book is None:
            book = StreamBook(shelf.next_ordinal, run[0].first_offset, shelf.max_ledger_id)
            shelf = Shelf(book, 0, book.ordinal + 1, shelf.max_ledger_id)
            books.append(book)
        page = _page(run, book=shelf.book)
        pages.append((page, run))
        full = shelf.pages + 1 >= BOOK_PAGES
        shelf = Shelf(None if full else shelf.book, 0 if full else shelf.pages + 1, shelf.next_ordinal,
                      max(shelf.max_ledger_id, page.max_ledger_id))
        tail = tail[PAGE_LEDGERS:]
    return record.replace(tail=tail, shelf=shelf), books, pages


def update_stream(
    store: MetadataStore,
    name: str,
    transform: Callable[[StreamRecord], StreamRecord | Rewrite | None],
    max_attempts: int = 100,
    *,
    read_back: bool = False,
    create: StreamRecord | None = None,
) -> Versioned[StreamRecord]:
    """The stream's one update: find (or, given `create`, create) the head, transform it, compare-and-set it
    (write_stream: sealing pages in the same multi); on conflict re-read and transform again. The counterpart
    of update_loop.update_ledger. Returns the head as stored, changed or not.

    A transform sees the head and returns a new head, or None for no change. It changes the tail (the last
    ledger is always there) and the head's fields; older ledgers are in pages it never sees, except for a
    compaction's, which returns a Rewrite (replace_run) with the pages it rewrote. A conflict on a znode of the
    Rewrite's `also` (changed, deleted, or created meanwhile) is retried like one on the head: the transform
    reads that znode again and decides.

    read_back=True is for a transform that recognizes its own update in a record (a commit finds its job or
    batch id there) and returns None for it. A write whose reply was lost (connection lost, session expired,
    request timed out) has an unknown outcome, not a failed one (DESIGN rule 16): the loop waits for
    ZooKeeper (at most the store's wait_seconds, $LEDGER_ZK_WAIT_SECONDS), syncs, re-reads and transforms again,
    so it returns only once the update is known to be in the stream, and raises UpdateOutcomeUnknownError if
    ZooKeeper stays away. A
    request of the lost connection cannot land after that read: ZooKeeper drops the old connection's requests
    once the session reconnects, and all of them once it expires. Without read_back a lost reply raises.

    Only the loop's own writes (the head's, and the stream's creation) are read back: a lost reply of a request the
    transform makes (a ledger it creates, say) raises out of the transform as any error of it does. Taken for a
    lost head write, it would run the transform again (until 2026-11-29: a stream writer's takeover then created a
    second ledger, and the first, whose create had landed, stayed OPEN, named by no stream).
    """
    deadline = lost = None
    for _ in range(max_attempts):
        transforming = False
        try:
            current = _find_or_create(store, name, create)
            transforming = True
            updated = transform(current.value)
            transforming = False
            if updated is None or updated == current.value:
                return current
            return write_stream(store, updated, current.version)
        except MetadataConflictError:
            continue
        except MetadataError as exc:
            if lost is not None and (isinstance(exc, ZooKeeperUnreachableError)
                                     or (transforming and isinstance(exc.__cause__, _NO_REPLY))):
                raise _outcome_unknown(store, name, lost) from exc  # away again before the read-back
            if transforming or not (read_back and isinstance(exc.__cause__, _NO_REPLY)):
                raise
            deadline = deadline or time.monotonic() + store.wait_seconds
            lost = exc
            _sync_when_reachable(store, name, deadline, exc)
    raise MetadataConflictError(f"stream {name!r} kept changing under {max_attempts} update attempts")


def _find_or_create(store: MetadataStore, name: str, create: StreamRecord | None) -> Versioned[StreamRecord]:
    while True:
        found = find_stream(store, name)
        if found is not None:
            return found
        if create is None:
            raise _no_such_stream(name)
        try:
            return create_stream(store, create.replace(name=name))
        except StreamExistsError:
            continue  # created meanwhile by someone else: read theirs


def _sync_when_reachable(store: MetadataStore, name: str, deadline: float, lost: MetadataError) -> None:
    """Wait until the session is connected again, then sync, so that the next read sees every landed write."""
    try:
        store.resync(layout.stream_path(name), deadline, deadline - store.wait_seconds)
    except MetadataError as exc:
        if not isinstance(exc, ZooKeeperUnreachableError) and not isinstance(exc.__cause__, _NO_REPLY):
            raise
        raise _outcome_unknown(store, name, lost) from lost


def _outcome_unknown(store: MetadataStore, name: str, lost: MetadataError) -> UpdateOutcomeUnknownError:
    return UpdateOutcomeUnknownError(
        f"stream {name!r}: an update got no reply from ZooKeeper ({lost}) and ZooKeeper stayed out of reach for "
        f"{store.wait_seconds:g}s (${ZK_WAIT_ENV}), so whether it landed is unknown; read the stream once ZooKeeper "
        "is back"
    )


def list_streams(store: MetadataStore) -> list[str]:
    return sorted(store.children(layout.STREAMS))


def mark_deleting(store: MetadataStore, name: str) -> Versioned[StreamRecord] | None:
    """The first step of a stream's deletion: its head marked deleting (by the stream's one update loop), after
    which no update lands on it (each one's compare-and-set fails, and its re-read finds no stream), so the head as
    marked (its tail) and its pages name every ledger the stream will ever have. Returns that head; None if there
    is no stream. ZooKeeper deletes a znode's children before the znode (delete_stream), so without the mark a
    commit or a compaction's swap could land on the head while its pages were being deleted: until 2026-11-29 the
    delete then stopped, leaving a head whose reads failed with OffsetsGoneError and ledgers no page named."""
    try:
        update_stream(store, name, lambda record: record.replace(deleting=True), read_back=True)
    except NoSuchStreamError:
        pass   # none, or marked already (by another delete, or by this update whose reply was lost: read back)
    found = find_stream(store, name, deleting=True)
    return found if found is not None and found.value.deleting else None


def delete_stream(store: MetadataStore, name: str) -> bool:
    """Delete the stream's head marked deleting (mark_deleting first) with its pages, not its ledgers; False if
    there is no marked head. Only that znode goes: the name is free once it is gone, and a writer or a query may
    make the stream again at once, while this delete reconnects after a lost reply; until 2026-11-29 the delete
    was sent again whole and took the new stream with it (its acknowledged appends, its committed batches)."""
    path = layout.stream_path(check_stream_name(name))
    found = store.read_with_stat(path, serde.decode_stream)
    if found is None or not found[0].deleting:
        return False
    return store.delete_created(path, found[1].czxid)


def _no_such_stream(name: str) -> NoSuchStreamError:
    return NoSuchStreamError(f"stream {name!r} does not exist; write to it first or check the name")


# -- the stream's ledgers --------------------------------------------------------------------------


def iter_ledgers(
    store: MetadataStore, record: StreamRecord, lo: int | None = None, hi: int | None = None
) -> Iterator[StreamLedger]:
    """The ledgers of the stream whose head is record that hold offsets in lo..hi (None: no bound), in offset
    order. Lists the book names, then each book that holds offsets of the range as the iteration reaches it, and
    reads only the pages overlapping the range; nothing if the tail covers it (rule 15)."""
    for _, pages in _live_regions(store, record, lo, hi):
        for page in pages:
            for ledger in read_page(store, record.name, page):
                if _kept(ledger, record) and _overlaps(ledger.first_offset, ledger.last_offset, lo, hi):
                    yield ledger
    for ledger in record.tail:
        if _overlaps(ledger.first_offset, ledger.last_offset, lo, hi):
            yield ledger


def held_ledgers(
    store: MetadataStore, record: StreamRecord, ledger_ids: Iterable[int], *, rewritten: bool = False
) -> set[int]:
    """Which of ledger_ids the stream holds.

    Reads only the pages that can hold one of them, newest first: a page whose highest ledger id is below
    every id asked for cannot, and neither can the books before a book made when the stream's pages held no
    higher id (paging.regions_holding). Ledger ids grow and a ledger is registered after it is created, so for
    the ledgers of a recent job or micro-batch these are the pages sealed since, in the newest book or two: the
    cost does not grow with the stream's history (rule 15). That holds for every ledger that came onto the
    stream through its tail (a commit's, a stream writer's), which are all but a compaction's new ledgers: a
    compaction puts those into the (old) pages it rewrites, and rewritten=True looks for them in every book
    (listing every page of the stream: for an operator's check of one such ledger).
    """
    missing = set(ledger_ids)
    held = {ledger.ledger_id for ledger in record.tail if ledger.ledger_id in missing}
    missing -= held
    if not missing:
        return held
    first, last = _paged_range(record, None, None)
    if first > last:
        return held
    books = list_books(store, record.name)
    for region in paging.regions_holding(books, min(missing), first, everywhere=rewritten):
        for page in reversed(region_pages(store, record, region)):
            if page.max_ledger_id < min(missing):
                continue
            found = {ledger.ledger_id for ledger in read_page(store, record.name, page)
                     if ledger.ledger_id in missing and _kept(ledger, record)}
            held |= found
            missing -= found
            if not missing:
                return held
    return held


def held_by_streams(store: MetadataStore, names: Iterable[str], ledger_ids: Iterable[int]) -> set[int]:
    """Which of ledger_ids the named streams hold now (a stream that is gone holds none)."""
    ledger_ids = list(ledger_ids)
    held: set[int] = set()
    for name in names:
        found = find_stream(store, name)
        if found is not None:
            held |= held_ledgers(store, found.value, ledger_ids)
    return held


def live_pages(
    store: MetadataStore, record: StreamRecord, lo: int | None = None, hi: int | None = None
) -> list[StreamPage]:
    """The pages holding the stream's ledgers below its tail that hold offsets in lo..hi (None: no bound), in
    offset order (see region_pages); none when the tail covers the range."""
    return [page for _, pages in _live_regions(store, record, lo, hi) for page in pages]


def regions(store: MetadataStore, record: StreamRecord, lo: int | None = None,
            hi: int | None = None) -> list[Region]:
    """The regions (books, flat pages) that hold the stream's paged offsets in lo..hi (None: no bound), in
    offset order: one listing of the book names."""
    first, last = _paged_range(record, lo, hi)
    return paging.regions_between(list_books(store, record.name), first, last) if first <= last else []


def region_pages(store: MetadataStore, record: StreamRecord, region: Region, lo: int | None = None,
                 hi: int | None = None) -> list[StreamPage]:
    """The pages of one region that a reader of the head record reads for offsets lo..hi (None: no bound), in
    offset order (one listing): of the pages up to the head's page_generation, those no page of a higher such
    generation replaced. They must cover the range (within the region) without a gap: pages deleted after this
    head was read (an overwrite or a truncation landed meanwhile, or a compaction's grace passed) raise
    OffsetsGoneError rather than read as fewer ledgers."""
    first, last = region.clamp(*_paged_range(record, lo, hi))
    if first > last:
        return []
    pages = paging.covering(_listed(store, record.name, region), record.page_generation, first, last)
    if pages is None:
        raise OffsetsGoneError(
            f"stream {record.name!r}: offsets {first}..{last} are no longer all in its pages (overwritten or "
            "truncated after its head was read); read it again"
        )
    return pages


def _live_regions(
    store: MetadataStore, record: StreamRecord, lo: int | None, hi: int | None
) -> Iterator[tuple[Region, list[StreamPage]]]:
    """Each region holding paged offsets of lo..hi with its pages for them, a region listed as it is reached."""
    for region in regions(store, record, lo, hi):
        yield region, region_pages(store, record, region, lo, hi)


def _paged_range(record: StreamRecord, lo: int | None, hi: int | None) -> tuple[int, int]:
    """lo..hi (None: no bound) narrowed to the offsets the head's pages hold: first_offset up to its tail."""
    first = record.first_offset if lo is None else max(lo, record.first_offset)
    last = record.tail_offset - 1 if hi is None else min(hi, record.tail_offset - 1)
    return first, last


def list_books(store: MetadataStore, name: str) -> list[StreamBook]:
    """The stream's books (one listing, names only), in no order."""
    try:
        names = store.children(layout.stream_books_path(name))
    except NoNodeError:
        return []  # a stream from before books, none sealed since
    return [layout.book_from_name(book) for book in names]


def _listed(store: MetadataStore, name: str, region: Region) -> list[StreamPage]:
    """Every page znode of one region in offset order (one listing), including those below first_offset not yet
    deleted and those a compaction replaced, until its grace period has passed; none if it is gone."""
    if region.book is None:
        path = layout.stream_pages_path(name)
    else:
        path = layout.stream_book_path(name, region.book)
    try:
        names = store.children(path)
    except NoNodeError:
        return []  # a book deleted after the listing (its offsets left the stream), or no flat pages
    return paging.sort_pages(layout.page_from_name(page, region.book) for page in names)


def list_pages(store: MetadataStore, name: str) -> list[StreamPage]:
    """Every page znode of the stream in offset order, including those below first_offset not yet deleted and
    those a compaction replaced, until its grace period has passed: a listing of every book (a stream's
    deletion, tests), its cost grows with the stream's history."""
    return [page for region in paging.regions(list_books(store, name)) for page in _listed(store, name, region)]


def _highest_flat_id(store: MetadataStore, name: str) -> int:
    """The highest ledger id in the stream's flat pages (-1: none), for its first book's name."""
    return max((page.max_ledger_id for page in _listed(store, name, Region(None, None, None))), default=-1)


def replace_run(
    store: MetadataStore, record: StreamRecord, run: tuple[StreamLedger, ...], by: tuple[StreamLedger, ...]
) -> Rewrite:
    """A compaction's update of the stream whose head is record: the run of closed ledgers (contiguous, as the
    stream holds them) replaced by the ledgers `by`, which cover exactly the run's offsets. Raises
    RunChangedError unless the run is still in the stream as given, and if a ledger of `by` would hold offsets
    of two books (a plan breaks its runs where books start: book_starts).

    A run within the tail changes the head only. One that starts in the pages rewrites the pages holding it
    (and takes the tail's ledgers up to its end, if it reaches into the tail, into the newest book) into pages
    of the next generation that cover the same offsets, in the same books; the pages they replace are in the
    result's `replaced`. The stream's last ledger is never in a run: the head keeps it in its tail.
    """
    _check_replacement(record.name, run, by)
    first, last = run[0].first_offset, run[-1].last_offset
    if first < record.first_offset or not record.tail or last >= record.tail[-1].first_offset:
        raise RunChangedError(
            f"stream {record.name!r}: offsets {first}..{last} are no longer a run of closed ledgers before its "
            f"last one (it now holds offsets from {record.first_offset}, its last ledger from "
            f"{record.tail[-1].first_offset if record.tail else record.first_offset})"
        )
    if record.byte_count is not None and first < record.byte_count.end_offset:
        record = record.replace(byte_count=None)  # the rewrite changes the bytes retention counted: it counts again
    if first >= record.tail_offset:
        at = _position(record, record.tail, run)
        return Rewrite(record.replace(tail=record.tail[:at] + by + record.tail[at + len(run):]))
    parts = list(_live_regions(store, record, first, last))
    reached = tuple(ledger for ledger in record.tail if ledger.first_offset <= last)
    placed = [(region, ledger) for region, pages in parts for page in pages
              for ledger in read_page(store, record.name, page)] + [(parts[-1][0], ledger) for ledger in reached]
    at = _position(record, tuple(ledger for _, ledger in placed), run)
    rewritten = placed[:at] + _placed(record.name, [region for region, _ in parts], by) + placed[at + len(run):]
    generation = record.page_generation + 1
    created = tuple((_page(chunk, generation, region.book), chunk) for region, chunk in _chunks(rewritten))
    head = record.replace(tail=record.tail[len(reached):], page_generation=generation)
    if head.shelf is not None:   # the next book's P counts what the rewrite put into pages
        highest = max(page.max_ledger_id for page, _ in created)
        head = head.replace(shelf=dataclasses.replace(head.shelf, max_ledger_id=max(head.shelf.max_ledger_id,
                                                                                      highest)))
    return Rewrite(head, created, tuple(page for _, pages in parts for page in pages))


def _placed(name: str, parts: list[Region], by: tuple[StreamLedger, ...]) -> list[tuple[Region, StreamLedger]]:
    """Pure: the region (of parts, in offset order) each new ledger goes into, the one holding its first offset;
    RunChangedError for one that would hold offsets of the next as well (pages never straddle two regions)."""
    starts = [region.first_offset for region in parts[1:]]
    placed = []
    for ledger in by:
        at = bisect.bisect_right(starts, ledger.first_offset)
        if at < len(starts) and ledger.last_offset >= starts[at]:
            raise RunChangedError(
                f"stream {name!r}: the new ledger {ledger.ledger_id} (offsets {ledger.first_offset}.."
                f"{ledger.last_offset}) would hold offsets of two books (one starts at {starts[at]}): plan runs that "
                "break where books start (book_starts)"
            )
        placed.append((parts[at], ledger))
    return placed


def _chunks(placed: list[tuple[Region, StreamLedger]]) -> list[tuple[Region, tuple[StreamLedger, ...]]]:
    """Pure: ledgers (in offset order, each with its region) cut into pages of at most PAGE_LEDGERS, each in one
    region."""
    chunks: list[tuple[Region, list[StreamLedger]]] = []
    for region, ledger in placed:
        if not chunks or chunks[-1][0] != region or len(chunks[-1][1]) == PAGE_LEDGERS:
            chunks.append((region, []))
        chunks[-1][1].append(ledger)
    return [(region, tuple(ledgers)) for region, ledgers in chunks]


def book_starts(store: MetadataStore, record: StreamRecord) -> list[int]:
    """Offsets where the stream's books start, above its first offset (one listing of the book names), and,
    when its tail reaches that far, where the head's next seals will start one: a compaction's plan breaks its
    runs there, as replace_run refuses a new ledger across a book's start."""
    starts = sorted({book.first_offset for book in list_books(store, record.name)
                     if book.first_offset > record.first_offset})
    shelf = record.shelf or Shelf()
    starting = shelf.book is None or record.first_offset >= record.tail_offset   # the next seal starts a book
    at = 0 if starting else (BOOK_PAGES - shelf.pages) * PAGE_LEDGERS
    return starts + ([record.tail[at].first_offset] if at < len(record.tail) else [])


def _check_replacement(name: str, run: tuple[StreamLedger, ...], by: tuple[StreamLedger, ...]) -> None:
    """by must hold the run's offsets exactly, contiguous; the run starts and ends with ledgers holding offsets
    (so that the pages holding it are those overlapping its offsets)."""
    if not run or not by or any(ledger.last_offset is None for ledger in run + by):
        raise ValueError(f"stream {name!r}: a run and its replacement are closed ledgers, at least one each")
    if run[0].last_offset < run[0].first_offset or run[-1].last_offset < run[-1].first_offset:
        raise ValueError(f"stream {name!r}: a run starts and ends with a ledger that holds offsets")
    for ledgers in (run, by):
        if any(b.first_offset != a.last_offset + 1 for a, b in zip(ledgers, ledgers[1:])):
            raise ValueError(f"stream {name!r}: ledgers {[s.ledger_id for s in ledgers]} are not contiguous")
    if (by[0].first_offset, by[-1].last_offset) != (run[0].first_offset, run[-1].last_offset):
        raise ValueError(
            f"stream {name!r}: the replacement holds offsets {by[0].first_offset}..{by[-1].last_offset}, the run "
            f"{run[0].first_offset}..{run[-1].last_offset}"
        )

def _position(record: StreamRecord, ledgers: tuple[StreamLedger, ...], run: tuple[StreamLedger, ...]) -> int:
    """Where run starts in ledgers; RunChangedError if it is not there, all of it, as given."""
    at = ledgers.index(run[0]) if run[0] in ledgers else -1
    if at < 0 or ledgers[at:at + len(run)] != run:
        raise RunChangedError(
            f"stream {record.name!r}: ledgers {run[0].ledger_id}..{run[-1].ledger_id} (offsets "
            f"{run[0].first_offset}..{run[-1].last_offset}) are no longer all in it as they were"
        )
    return at


def _page(ledgers: tuple[StreamLedger, ...], generation: int = 0, book: StreamBook | None = None) -> StreamPage:
    return StreamPage(ledgers[0].first_offset, ledgers[-1].last_offset, max(ledger.ledger_id for ledger in ledgers),
                      generation, book)


def read_page(store: MetadataStore, name: str, page: StreamPage) -> tuple[StreamLedger, ...]:
    found = store.read(layout.stream_page_path(name, page), serde.decode_page)
    if found is None:
        raise OffsetsGoneError(
            f"stream {name!r}: offsets {page.first_offset}..{page.last_offset} left the stream while it was "
            "read (overwritten or truncated meanwhile); read it again"
        )
    return found.value


def drop_below(
    store: MetadataStore, before: StreamRecord, first_offset: int, discard: Callable[[int], None],
    still_there: Callable[[], bool],
) -> None:
    """After the CAS that moved the stream's first offset from before's up to first_offset (an overwrite, a
    truncation): discard (by id) every ledger that left the stream, then delete the pages left with none, and
    the books left with no page. O(what left): the tail of before, the book names, and the books (and flat
    pages) below first_offset (pages whose deletion failed before included). Best effort: a ledger that cannot
    be discarded is logged, and its page stays for a later call (readers skip it).

    Pages are found by the stream's name, so before each page still_there() (the cut's record exists: it goes with
    its stream) says the stream is the one that was cut: a call that comes late (its process stalled) must not
    delete the pages of a stream deleted and created again under the name meanwhile."""
    name = before.name
    for ledger in before.tail:
        if ledger.last_offset is not None and ledger.last_offset < first_offset:
            _discard_quietly(name, ledger.ledger_id, discard)
    for region in paging.regions(list_books(store, name)):
        if region.first_offset is not None and region.first_offset >= first_offset:
            break
        emptied = True
        for page in _listed(store, name, region):
            if page.first_offset >= first_offset:
                emptied = False
                break
            if not still_there():
                log.info("stream %r was deleted (or created again) since its cut: its pages are left alone", name)
                return
            emptied &= _drop_page(store, name, page, first_offset, discard)
        if region.book is not None and emptied and still_there():
            _delete_book(store, name, region.book)


def _drop_page(store: MetadataStore, name: str, page: StreamPage, first_offset: int,
               discard: Callable[[int], None]) -> bool:
    """Discard the page's ledgers below first_offset, and delete it if that was all of them; whether it is gone."""
    try:
        ledgers = read_page(store, name, page)
    except OffsetsGoneError:
        return True  # deleted meanwhile by another call
    gone = [ledger for ledger in ledgers if ledger.last_offset < first_offset]
    discarded = [_discard_quietly(name, ledger.ledger_id, discard) for ledger in gone]
    if all(discarded) and len(gone) == len(ledgers):
        store.delete(layout.stream_page_path(name, page))
        return True
    return False


def _delete_book(store: MetadataStore, name: str, book: StreamBook) -> None:
    try:
        store.delete(layout.stream_book_path(name, book))
    except MetadataError as exc:
        if not isinstance(exc.__cause__, NotEmptyError):
            raise
        log.info("stream %r: book %s got a page meanwhile and stays", name, layout.book_name(book))


def _discard_quietly(name: str, ledger_id: int, discard: Callable[[int], None]) -> bool:
    try:
        discard(ledger_id)
    except LedgerError as exc:
        log.warning("stream %r: ledger %d left the stream but was not deleted: %s", name, ledger_id, exc)
        return False
    return True


def _kept(paged: StreamLedger, record: StreamRecord) -> bool:
    """Whether a ledger of a page is still in the stream: it holds an offset from first_offset on. (Every
    ledger of the tail is; a truncation takes those below first_offset off the tail.)"""
    return paged.last_offset >= record.first_offset


def _overlaps(first: int, last: int | None, lo: int | None, hi: int | None) -> bool:
    """Whether first..last (last None: no end, an OPEN ledger) meets lo..hi (None: no bound)."""
    return (lo is None or last is None or last >= lo) and (hi is None or first <= hi)
