"""Streams: the head of a segmented log and the sealed pages that hold its older ledgers.

    /streams/NAME                 the head (StreamRecord): format, schema, owner, commit records, first offset,
                                  and the tail: the most recent ledgers, always including the last one
    /streams/NAME/pages/F-L-M     a sealed page: PAGE_LEDGERS closed ledgers covering offsets F..L, M the
                                  highest ledger id in it; immutable once created

Every update goes through update_stream (find or create, transform the head, compare-and-set): the head's
CAS and the creation of the pages an overflowing tail is sealed into are one ZooKeeper multi, so a job's
or micro-batch's ledgers become visible in one step, and a commit writes the head plus at most
PAGES_PER_UPDATE pages whatever the stream's history (DESIGN rule 15). A head written by older software
(every ledger in one record) is read as a head with a long tail and sealed into pages over its next writes.
Offsets only grow (rule 17), so a page's name never comes back: pages below first_offset (after an
overwrite or a truncation) are skipped by readers and deleted by drop_below once their ledgers are.

Reads take the head (one znode), then iter_ledgers reads only the pages that overlap the offsets asked
for (none when the tail covers them), and held_ledgers only the pages that can hold the ledger ids asked
for (a page's name carries its highest ledger id; ledger ids grow, so these are the recent pages).
"""
from __future__ import annotations

import logging
import re
import time
from typing import Callable, Iterable, Iterator

from kazoo.exceptions import (
    BadVersionError, ConnectionLoss, NodeExistsError, NoNodeError, OperationTimeoutError, SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError

from metadata import layout, serde
from metadata.errors import (
    LedgerError, MetadataConflictError, MetadataError, NoSuchStreamError, OffsetsGoneError, StreamExistsError,
)
from metadata.model import StreamLedger, StreamPage, StreamRecord, Versioned
from metadata.store import MetadataStore

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$")
READ_BACK_SECONDS = 60.0  # how long an update whose reply was lost waits for ZooKeeper to learn its outcome
_NO_REPLY = (ConnectionLoss, SessionExpiredError, OperationTimeoutError, KazooTimeoutError)
# A page holds PAGE_LEDGERS ledgers (5-7 KiB); the head keeps at most PAGE_LEDGERS plus what one update added,
# and one update seals at most PAGES_PER_UPDATE pages. An old single-record stream (up to ZooKeeper's 1 MB,
# 35,000-50,000 ledgers) is thus paged over its next 17-25 writes, each multi smaller than the old record
# (the encoding is more compact), so none exceeds ZooKeeper's 1 MB request limit.
PAGE_LEDGERS = 256
PAGES_PER_UPDATE = 8


class InvalidStreamNameError(LedgerError):
    """Stream names are 1-200 letters, digits, '_', '.', '-', starting with a letter or digit."""


class InvalidStreamFormatError(LedgerError):
    """The stream holds another format than the operation needs (raw payloads vs. Arrow batches)."""


class UpdateOutcomeUnknownError(MetadataError):
    """A stream update got no reply and ZooKeeper stayed out of reach, so whether it landed is not known."""


def check_stream_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidStreamNameError(
            f"invalid stream name {name!r}: use 1-200 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return name


def create_stream(store: MetadataStore, record: StreamRecord) -> Versioned[StreamRecord]:
    check_stream_name(record.name)
    record = record.replace(created_at=record.created_at or time.time())
    transaction = store.transaction()
    transaction.create(layout.stream_path(record.name), serde.encode_stream(record))
    transaction.create(layout.stream_pages_path(record.name))
    try:
        transaction.commit()
    except NodeExistsError as exc:
        raise StreamExistsError(f"stream {record.name!r} exists already") from exc
    return Versioned(record, 0)


def read_stream(store: MetadataStore, name: str) -> Versioned[StreamRecord]:
    """The stream's head (one znode): its tail, not its older ledgers (iter_ledgers reads those)."""
    found = find_stream(store, name)
    if found is None:
        raise _no_such_stream(name)
    return found


def find_stream(store: MetadataStore, name: str) -> Versioned[StreamRecord] | None:
    return store.read(layout.stream_path(check_stream_name(name)), serde.decode_stream)


def write_stream(store: MetadataStore, record: StreamRecord, expected_version: int) -> Versioned[StreamRecord]:
    """Compare-and-set the head at expected_version; in the same multi, the oldest ledgers of a tail longer
    than PAGE_LEDGERS are sealed into new pages. Returns the head as stored (its tail shortened so)."""
    head, pages = _sealed(record)
    try:
        version = _commit(store, head, expected_version, pages)
    except NoNodeError as exc:
        if not store.exists(layout.stream_path(record.name)):
            raise NoSuchStreamError(f"stream {record.name!r} was deleted while being updated") from exc
        # A stream created before pages existed: its pages directory comes with its first page.
        store.ensure_path(layout.stream_pages_path(record.name))
        version = _commit(store, head, expected_version, pages)
    return Versioned(head, version)


def _commit(
    store: MetadataStore, head: StreamRecord, expected_version: int, pages: list[tuple[StreamPage, tuple]]
) -> int:
    """One multi: the head's CAS and the pages' creation; returns the head's new version."""
    transaction = store.transaction()
    transaction.set_data(layout.stream_path(head.name), serde.encode_stream(head), expected_version)
    for page, ledgers in pages:
        transaction.create(layout.stream_page_path(head.name, page), serde.encode_page(ledgers))
    try:
        return transaction.commit()[0].version
    except BadVersionError as exc:
        raise MetadataConflictError(
            f"stream {head.name!r} changed since it was read (expected version {expected_version}); re-read and retry"
        ) from exc
    except NodeExistsError as exc:
        raise MetadataError(
            f"stream {head.name!r}: a page for offsets {pages[0][0].first_offset}.. exists already, though the "
            "head does not list it; the stream's metadata was changed outside this software"
        ) from exc


def _sealed(record: StreamRecord) -> tuple[StreamRecord, list[tuple[StreamPage, tuple[StreamLedger, ...]]]]:
    """record with the oldest PAGE_LEDGERS-runs of its tail taken off into pages, while the tail is longer than
    PAGE_LEDGERS (it keeps at least its last ledger); only closed ledgers are sealed."""
    tail = record.tail
    pages = []
    while len(tail) > PAGE_LEDGERS and len(pages) < PAGES_PER_UPDATE:
        run = tail[:PAGE_LEDGERS]
        if any(ledger.last_offset is None for ledger in run):
            break
        page = StreamPage(run[0].first_offset, run[-1].last_offset, max(ledger.ledger_id for ledger in run))
        pages.append((page, run))
        tail = tail[PAGE_LEDGERS:]
    return record.replace(tail=tail), pages


def update_stream(
    store: MetadataStore,
    name: str,
    transform: Callable[[StreamRecord], StreamRecord | None],
    max_attempts: int = 100,
    *,
    read_back: bool = False,
    create: StreamRecord | None = None,
) -> Versioned[StreamRecord]:
    """The stream's one update: find (or, given `create`, create) the head, transform it, compare-and-set it
    (write_stream: sealing pages in the same multi); on conflict re-read and transform again. The counterpart
    of update_loop.update_ledger. Returns the head as stored, changed or not.

    A transform sees the head and returns a new head, or None for no change. It changes the tail (the last
    ledger is always there) and the head's fields; older ledgers are in pages it never sees.

    read_back=True is for a transform that recognizes its own update in a record (a commit finds its job or
    batch id there) and returns None for it. A write whose reply was lost (connection lost, session expired,
    request timed out) has an unknown outcome, not a failed one (DESIGN rule 16): the loop waits for
    ZooKeeper (at most READ_BACK_SECONDS), syncs, re-reads and transforms again, so it returns only once the
    update is known to be in the stream, and raises UpdateOutcomeUnknownError if ZooKeeper stays away. A
    request of the lost connection cannot land after that read: ZooKeeper drops the old connection's requests
    once the session reconnects, and all of them once it expires. Without read_back a lost reply raises.
    """
    deadline = None
    for _ in range(max_attempts):
        try:
            current = _find_or_create(store, name, create)
            updated = transform(current.value)
            if updated is None or updated == current.value:
                return current
            return write_stream(store, updated, current.version)
        except MetadataConflictError:
            continue
        except MetadataError as exc:
            if not (read_back and isinstance(exc.__cause__, _NO_REPLY)):
                raise
            deadline = deadline or time.monotonic() + READ_BACK_SECONDS
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
    while time.monotonic() < deadline:
        if store.connected:  # a request queued while disconnected would wait for ZooKeeper without bound
            try:
                store.sync(layout.stream_path(name))
                return
            except MetadataError as exc:
                if not isinstance(exc.__cause__, _NO_REPLY):
                    raise
        time.sleep(0.05)
    raise UpdateOutcomeUnknownError(
        f"stream {name!r}: an update got no reply from ZooKeeper ({lost}) and ZooKeeper stayed out of reach for "
        f"{READ_BACK_SECONDS:.0f}s, so whether it landed is unknown; read the stream once ZooKeeper is back"
    ) from lost


def list_streams(store: MetadataStore) -> list[str]:
    return sorted(store.children(layout.STREAMS))


def delete_stream(store: MetadataStore, name: str) -> None:
    """Delete the stream's head and pages (not its ledgers)."""
    store.delete(layout.stream_path(check_stream_name(name)), recursive=True)


def _no_such_stream(name: str) -> NoSuchStreamError:
    return NoSuchStreamError(f"stream {name!r} does not exist; write to it first or check the name")


# -- the stream's ledgers --------------------------------------------------------------------------


def iter_ledgers(
    store: MetadataStore, record: StreamRecord, lo: int | None = None, hi: int | None = None
) -> Iterator[StreamLedger]:
    """The ledgers of the stream whose head is record that hold offsets in lo..hi (None: no bound), in offset
    order. Reads only the pages overlapping the range, none if the tail covers it (rule 15)."""
    if lo is None or lo < record.tail_offset:
        for page in live_pages(store, record):
            if _overlaps(page.first_offset, page.last_offset, lo, hi):
                for ledger in read_page(store, record.name, page):
                    if _kept(ledger, record) and _overlaps(ledger.first_offset, ledger.last_offset, lo, hi):
                        yield ledger
    for ledger in record.tail:
        if _overlaps(ledger.first_offset, ledger.last_offset, lo, hi):
            yield ledger


def held_ledgers(store: MetadataStore, record: StreamRecord, ledger_ids: Iterable[int]) -> set[int]:
    """Which of ledger_ids the stream holds.

    Reads only the pages that can hold one of them, newest first: a page whose highest ledger id is below
    every id asked for cannot. Ledger ids grow and a ledger is registered after it is created, so for the
    ledgers of a recent job or micro-batch these are the pages sealed since: the cost does not grow with the
    stream's history (rule 15).
    """
    missing = set(ledger_ids)
    held = {ledger.ledger_id for ledger in record.tail if ledger.ledger_id in missing}
    missing -= held
    for page in reversed(live_pages(store, record) if missing else []):
        if page.max_ledger_id < min(missing):
            continue
        found = {ledger.ledger_id for ledger in read_page(store, record.name, page)
                 if ledger.ledger_id in missing and _kept(ledger, record)}
        held |= found
        missing -= found
        if not missing:
            break
    return held


def live_pages(store: MetadataStore, record: StreamRecord) -> list[StreamPage]:
    """The pages holding the stream's ledgers below its tail, in offset order (listed once). They must cover
    first_offset up to the tail without a gap: pages deleted after this head was read (an overwrite or a
    truncation landed meanwhile) raise OffsetsGoneError rather than read as fewer ledgers."""
    if record.first_offset >= record.tail_offset:
        return []
    pages = [page for page in list_pages(store, record.name)
             if page.last_offset >= record.first_offset and page.first_offset < record.tail_offset]
    ends = [record.first_offset] + [page.last_offset + 1 for page in pages]
    starts = [page.first_offset for page in pages] + [record.tail_offset]
    if not pages or starts[0] > ends[0] or ends[1:] != starts[1:]:
        raise OffsetsGoneError(
            f"stream {record.name!r}: offsets {record.first_offset}..{record.tail_offset - 1} are no longer all in "
            "its pages (overwritten or truncated after its head was read); read it again"
        )
    return pages


def list_pages(store: MetadataStore, name: str) -> list[StreamPage]:
    """Every page znode of the stream in offset order, including those below first_offset not yet deleted."""
    try:
        names = store.children(layout.stream_pages_path(name))
    except NoNodeError:
        return []  # a stream created before pages existed, never sealed since
    return sorted((layout.page_from_name(page_name) for page_name in names), key=lambda page: page.first_offset)


def read_page(store: MetadataStore, name: str, page: StreamPage) -> tuple[StreamLedger, ...]:
    found = store.read(layout.stream_page_path(name, page), serde.decode_page)
    if found is None:
        raise OffsetsGoneError(
            f"stream {name!r}: offsets {page.first_offset}..{page.last_offset} left the stream while it was "
            "read (overwritten or truncated meanwhile); read it again"
        )
    return found.value


def drop_below(
    store: MetadataStore, before: StreamRecord, first_offset: int, discard: Callable[[int], None]
) -> None:
    """After the CAS that moved the stream's first offset from before's up to first_offset (an overwrite, a
    truncation): discard (by id) every ledger that left the stream, then delete the pages left with none.
    O(what left): the tail of before and the pages below first_offset (pages whose deletion failed before
    included). Best effort: a ledger that cannot be discarded is logged, and its page stays for a later call
    (readers skip it)."""
    name = before.name
    for ledger in before.tail:
        if ledger.last_offset is not None and ledger.last_offset < first_offset:
            _discard_quietly(name, ledger.ledger_id, discard)
    for page in list_pages(store, name):
        if page.first_offset >= first_offset:
            break
        try:
            ledgers = read_page(store, name, page)
        except OffsetsGoneError:
            continue  # deleted meanwhile by another call
        gone = [ledger for ledger in ledgers if ledger.last_offset < first_offset]
        discarded = [_discard_quietly(name, ledger.ledger_id, discard) for ledger in gone]
        if all(discarded) and len(gone) == len(ledgers):
            store.delete(layout.stream_page_path(name, page))


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
