"""Truncation and retention of streams (issue 14 item 3, DESIGN rules 15 and 17): whole closed ledgers leave a
stream from its front in one compare-and-set, and are deleted after it.

A cut moves the stream's first_offset up to the first offset of the first ledger it keeps. Only ledgers that
lie entirely below that point leave (a ledger straddling it stays whole), never an OPEN one, and first_offset
never goes beyond the stream's next offset: offsets only grow and are never handed out twice (rule 17). A
cut goes through these steps; a process that dies after any of them leaves the stream readable and complete
from its first offset, and the next truncation or retention run of the stream (clean_cuts, which every run
calls first) finishes what it left:

1. plan: /streams/NAME/cuts/<id> is created, state planned, naming the process's writer id (an ephemeral
   znode while the process lives).
2. cut: one update_stream multi sets the head (first_offset moved, the ledgers below it taken off the tail,
   retention's byte count adjusted) and the record, at version 0, to state cut: the offsets that left and
   the tail ledgers taken off, which no page holds. Pages are not rewritten: readers skip a page's ledgers
   below first_offset (streams.iter_ledgers). A lost reply is read back: the record's state says whether the
   cut landed (rule 16).
3. delete: the record's tail ledgers, then the ledgers of the pages below the new first offset, the pages
   left with none and the books left with no page (streams.drop_below), then the record, kept while one of those
   ledgers could not be deleted (the next run, or a Spark job's start on the stream, tries again: clean_cuts).
   Everything here is idempotent.
4. the stream's compactions: those past their grace are finished, and at once those of tail ledgers whose whole
   run the cut took off (compaction.clean_compactions): their replaced ledgers are named in their record only.

A planned record whose process is gone is deleted: its cut cannot land any more (ZooKeeper drops the
requests of a session that ended, and the cut's multi sets the record at version 0). So is one of the calling
client's own (its writer id) whose run has ended: its cleanup failed (ZooKeeper went away between the plan and the
cut), and its writer, this live process, would keep it from every later run's clean_cuts for as long as it lives
(a retention loop: for good). That delete is safe even were the cut's multi still on its way: it is at version 0,
so either the cut landed first (the record is at version 1, state cut: the delete fails and the cut is finished)
or the cut's multi, which sets the record at version 0, fails on its absence and never lands. A run of the same
process still going (another thread's, on a shared client) is never touched: the process knows its runs in flight.

No grace: the ledgers are deleted right after the cut. A read planned before it (a Spark job's tasks, a
micro-batch planned and not yet read) that then finds a ledger gone, or a page gone while it lists them, gets
failOnDataLoss (connector/spark/data_loss.py): fail naming the first offset the stream still holds, or skip
those offsets. It asked for offsets that are gone, and a read planned a moment later gets the same answer;
no read ever gets other rows than those at its offsets. (A compaction keeps replaced ledgers for a grace
because it took nothing away: there a late read must still succeed.)

Retention (a stream's Retention, in its head: set with `ledger stream retention` or the Spark write options
retentionMs / retentionBytes) is applied by apply_retention, run by `ledger stream retention --apply
[--every SECONDS]`:
- max_age: from the front, the closed ledgers whose metadata was last written (ZooKeeper's mtime of
  /ledgers/L..., by the server's clock: the close, or a later ensemble change) more than max_age ago. That
  is never before the ledger's newest row was written, so no row younger than max_age goes; a compacted
  ledger counts from its compaction. It stops at the first ledger that is not that old (as Kafka does).
- max_bytes: from the front, the oldest closed ledgers while the stream's closed ledgers hold more than
  max_bytes (ledger metadata `length`; a length a recovery did not record counts 0), never its last ledger.
  The head keeps what was counted (ByteCount), stored by a run that cuts (in its CAS) and by one that cuts
  nothing once COUNT_LEDGERS ledgers were counted since the stored count (a CAS of the head alone): a run reads
  the lengths of the ledgers added since the stored count and of those it removes, and none of the front's
  while the stream is under its limit. A compaction of counted offsets adjusts the count in its swap (the new
  ledgers' lengths for the old ones'); an overwrite (first_offset moved by another path) invalidates it, and the
  next run counts the stream's ledgers again once.

Cost of one run, whatever the stream's age: the head; the book names and the page names of the books it
looks at (as any read below the tail lists); the pages holding the ledgers it looks at; ledger metadata for
those it removes and a read-ahead (age, and size over its limit), and for those added since the last run and
fewer than COUNT_LEDGERS before (size: those counted since the stored count); then one delete per removed ledger
and per emptied page and book; and a listing of the compaction records.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import json
import logging
import threading
import time
import uuid
from typing import Callable, Iterable, Iterator

from kazoo.exceptions import BadVersionError, NoNodeError

from connector.client import LedgerClient
from connector.spark.recovery import discard
from metadata import layout, registry
from metadata.errors import LedgerError, MetadataError
from metadata.model import ByteCount, Retention, StreamLedger, StreamRecord
from metadata.store import MetadataStore
from metadata.streams import (
    Rewrite, check_stream_name, create_directory, drop_below, iter_ledgers, list_streams, read_stream, update_stream,
)

log = logging.getLogger(__name__)

PLANNED, CUT = "planned", "cut"   # a cut record's states, and with these the steps on_step(step, cut) reports
TAIL_DELETED, DELETED = "tail-deleted", "deleted"
TRUNCATE, RETENTION = "truncate", "retention"
CHUNK_LEDGERS = 64   # ledger metadata read ahead (in parallel) while looking for the end of a cut
READ_THREADS = 8
COUNT_LEDGERS = 64   # ledgers counted since the head's byte count that make a run which cuts nothing store it

Step = Callable[[str, "Cut"], None]
# Paths of the planned records of this process's runs that have not ended (clean_cuts leaves them to their run).
_in_flight: set[str] = set()
_in_flight_lock = threading.Lock()


class TruncateOpenLedgerError(LedgerError):
    """A truncation point inside or past the stream's OPEN last ledger: a truncation removes closed ledgers only."""


@dataclasses.dataclass(frozen=True)
class Cut:
    """A cut's durable record, /streams/<stream>/cuts/<id> (see the module docstring): the stream's offsets
    from_offset..to_offset - 1 left it, and `ledgers` are the tail ledgers it took off (no page holds them)."""

    cut_id: str
    stream: str
    writer: str
    state: str = PLANNED
    from_offset: int = 0
    to_offset: int = 0
    ledgers: tuple[StreamLedger, ...] = ()

    @property
    def path(self) -> str:
        return layout.stream_cut_path(self.stream, self.cut_id)

    def encode(self) -> bytes:
        body = dataclasses.asdict(self)
        body["ledgers"] = [[s.ledger_id, s.first_offset, s.last_offset] for s in self.ledgers]
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> "Cut":
        body = json.loads(data)
        body["ledgers"] = tuple(StreamLedger(*row) for row in body["ledgers"])
        return cls(**body)


@dataclasses.dataclass(frozen=True)
class CutResult:
    """What one truncation or retention run did: the stream now starts at first_offset (it started at
    from_offset); `ledgers` left it and were deleted (paged ones counted as they were deleted)."""

    stream: str
    reason: str
    from_offset: int
    first_offset: int
    ledgers: int = 0
    finished_cuts: int = 0   # cuts of earlier runs that died before their deletions, finished by this one

    @property
    def cut(self) -> bool:
        return self.first_offset > self.from_offset


def truncate_stream(
    lc: LedgerClient, name: str, before_offset: int, *, password: bytes = b"", on_step: Step | None = None,
) -> CutResult:
    """Remove the stream's whole ledgers that lie entirely below before_offset: its first offset moves to the
    first offset of the first ledger it keeps (at most its next offset). Refused for a point inside or past an
    OPEN last ledger (TruncateOpenLedgerError). A point at or below the first offset changes nothing."""
    if before_offset < 0:
        raise ValueError(f"a truncation point is a stream offset >= 0, not {before_offset}")

    def decide(record: StreamRecord, facts: "_LedgerFacts") -> tuple[int, ByteCount | None] | None:
        if before_offset <= record.first_offset:
            return None
        _check_open_tail(record, before_offset)
        first = _first_kept(lc.store, record, before_offset)
        return first, _count_after(lc.store, record, first, facts)

    return _cut_front(lc, name, TRUNCATE, decide, password, on_step)


def apply_retention(
    lc: LedgerClient, name: str, *, now: float | None = None, password: bytes = b"", on_step: Step | None = None,
) -> CutResult:
    """Remove the ledgers past the stream's retention (see the module docstring); nothing if it has none."""
    def decide(record: StreamRecord, facts: "_LedgerFacts") -> tuple[int, ByteCount | None] | None:
        if not record.retention.is_set:
            return None
        return _retained_from(lc.store, record, facts, time.time() if now is None else now)

    return _cut_front(lc, name, RETENTION, decide, password, on_step)


def apply_all(
    lc: LedgerClient, names: Iterable[str] | None = None, *, password: bytes = b"", on_error=None,
) -> list[CutResult]:
    """apply_retention to the named streams, or to every stream with a retention (reads each stream's head).
    A stream that fails is reported to on_error(name, error) (default: raised) and the others go on."""
    results = []
    for name in names if names is not None else streams_with_retention(lc.store):
        try:
            results.append(apply_retention(lc, name, password=password))
        except LedgerError as exc:
            if on_error is None:
                raise
            on_error(name, exc)
    return results


def streams_with_retention(store: MetadataStore) -> list[str]:
    found = []
    for name in list_streams(store):
        try:
            if read_stream(store, name).value.retention.is_set:
                found.append(name)
        except LedgerError:
            continue  # deleted while listed
    return found


def set_retention(store: MetadataStore, name: str, max_age: float | None = None,
                  max_bytes: int | None = None) -> StreamRecord:
    """Change the stream's retention: a limit given replaces the one set, a negative one removes it, None keeps
    it (Retention.updated). Returns the head as stored. A lost reply is read back: applied again, the change
    changes nothing."""
    return update_stream(
        store, name, lambda record: record.replace(retention=record.retention.updated(max_age, max_bytes)),
        read_back=True).value


# -- the cut --------------------------------------------------------------------------------------------


def _cut_front(
    lc: LedgerClient, name: str, reason: str,
    decide: Callable[[StreamRecord, "_LedgerFacts"], tuple[int, ByteCount | None] | None],
    password: bytes, on_step: Step | None,
) -> CutResult:
    on_step = on_step or (lambda step, cut: None)
    check_stream_name(name)   # before clean_cuts makes a path of it ('..' made kazoo raise a bare ValueError)
    finished = clean_cuts(lc, name, password=password)
    planned = Cut(uuid.uuid4().hex[:16], name, lc.writer_id)
    with _running(planned):
        return _cut_planned(lc, planned, reason, decide, password, on_step, finished)


@contextlib.contextmanager
def _running(planned: Cut) -> Iterator[None]:
    """While this process's run of planned goes on, clean_cuts leaves its record to it."""
    with _in_flight_lock:
        _in_flight.add(planned.path)
    try:
        yield
    finally:
        with _in_flight_lock:
            _in_flight.discard(planned.path)


def _cut_planned(
    lc: LedgerClient, planned: Cut, reason: str,
    decide: Callable[[StreamRecord, "_LedgerFacts"], tuple[int, ByteCount | None] | None],
    password: bytes, on_step: Step, finished: int,
) -> CutResult:
    """Steps 1-4 of the run whose record is planned (finished: the earlier cuts clean_cuts finished)."""
    store, name = lc.store, planned.stream
    head = read_stream(store, name).value
    create_directory(store, name, layout.stream_cuts_path(name))
    store.create(planned.path, planned.encode())
    on_step(PLANNED, planned)
    facts = _LedgerFacts(store)
    made: list[Cut] = []

    def transform(record: StreamRecord) -> Rewrite | None:
        made.clear()
        found = store.read(planned.path, Cut.decode)
        if found is None:
            raise MetadataError(f"stream {name!r}: cut record {planned.path} was deleted while this run planned")
        if found.value.state == CUT:
            made.append(found.value)   # landed, and its reply was lost: read back (rule 16)
            return None
        decision = decide(record, facts)
        if decision is None:
            return None
        first, count = decision
        if first <= record.first_offset:   # nothing to cut: keep what was counted, for the next runs (rule 15)
            return record.replace(byte_count=count) if _worth_storing(record, count) else None
        removed = tuple(itertools.takewhile(lambda s: s.last_offset is not None and s.last_offset < first, record.tail))
        cut = dataclasses.replace(planned, state=CUT, from_offset=record.first_offset, to_offset=first,
                                  ledgers=removed)
        made.append(cut)
        return Rewrite(record.replace(first_offset=first, tail=record.tail[len(removed):], byte_count=count),
                       also=((cut.path, cut.encode(), 0),))

    try:
        stored = update_stream(store, name, transform, read_back=True).value
    except BaseException:
        _forget_planned(store, planned)
        raise
    if not made:
        _forget_planned(store, planned)
        _clean_compactions(lc, stored, password)
        return CutResult(name, reason, head.first_offset, head.first_offset, finished_cuts=finished)
    cut = made[0]
    on_step(CUT, cut)
    deleted = _delete(lc, cut, password, on_step)
    on_step(DELETED, cut)
    _clean_compactions(lc, stored, password)
    return CutResult(name, reason, cut.from_offset, cut.to_offset, deleted, finished)


def _clean_compactions(lc: LedgerClient, head: StreamRecord, password: bytes) -> None:
    """Finish the stream's compactions past their grace, and at once those whose run (in the tail: named in their
    record only) lies below the stream's first offset, whose rows the cut took away; undo those of processes gone.
    Without it, a stream compacted once and then only truncated kept the ledgers a compaction replaced for good,
    truncated rows readable by ledger id. Best effort: what is left, the next run (or compaction, or job start)
    finishes."""
    from connector.compaction import clean_compactions   # here: it loads Spark's and Arrow's modules

    try:
        done = clean_compactions(lc, head.name, password=password, first_offset=head.first_offset)
    except LedgerError as exc:
        log.warning("stream %r: compactions past their grace or below the first offset not finished: %s",
                    head.name, exc)
        return
    if done.finished or done.abandoned:
        log.info("stream %r: %d compactions finished, %d of gone processes undone", head.name,
                 len(done.finished), len(done.abandoned))


def _forget_planned(store: MetadataStore, planned: Cut) -> None:
    """Delete a planned record that never cut (at version 0: a record that did cut is at version 1 and stays)."""
    transaction = store.transaction()
    transaction.delete(planned.path, 0)
    try:
        transaction.commit()
    except (BadVersionError, NoNodeError):
        pass
    except MetadataError as exc:
        log.warning("stream %r: planned cut %s not deleted (%s); the next run deletes it", planned.stream,
                    planned.cut_id, exc)


def _delete(lc: LedgerClient, cut: Cut, password: bytes, on_step: Step = lambda step, cut: None) -> int:
    """Step 3: the cut's tail ledgers, the paged ledgers below its end and the pages emptied, then its record,
    kept if a ledger, of the tail or of a page, could not be deleted: the stream's next truncation or retention run,
    or a Spark job's start on it (clean_cuts), tries again. Returns the ledgers deleted."""
    deleted = [0]
    failed: list[int] = []

    def counted(ledger_id: int) -> None:
        if lc.store.exists(layout.ledger_path(ledger_id)):   # not deleted by an earlier cut (a straddling page's)
            try:
                discard(lc, ledger_id, password)
            except LedgerError:
                failed.append(ledger_id)
                raise
            deleted[0] += 1

    for ledger in cut.ledgers:
        try:
            counted(ledger.ledger_id)
        except LedgerError as exc:
            log.warning("stream %r: ledger %d left the stream but was not deleted: %s", cut.stream,
                        ledger.ledger_id, exc)
    on_step(TAIL_DELETED, cut)
    # The cut's record goes with its stream: while it is there, the pages under the name are this stream's.
    drop_below(lc.store, StreamRecord(cut.stream), cut.to_offset, counted,
               still_there=lambda: lc.store.exists(cut.path))
    if failed:
        log.warning("stream %r: cut %s kept: ledgers %s not deleted; the stream's next truncation or retention "
                    "run, or a Spark job's start on it, deletes them", cut.stream, cut.cut_id, failed)
    else:
        lc.store.delete(cut.path)
    return deleted[0]


def overwrite_cut(replaced: StreamRecord, job_id: str) -> Cut:
    """The cut an overwrite makes, as landed: every ledger of the head it replaced leaves (the tail's, and the pages'
    below its next offset). The overwrite writes it in its own multi, so that its deletes are as durable as a
    truncation's: a driver that dies before them leaves the record, which the stream's next job start (the janitor)
    or truncation or retention run finishes (clean_cuts). Its writer names the job (a cut record's writer matters
    only while it is planned)."""
    return Cut(uuid.uuid4().hex[:16], replaced.name, job_id, CUT, replaced.first_offset, replaced.next_offset,
               replaced.tail)


def finish_cut(lc: LedgerClient, cut: Cut, password: bytes = b"") -> int:
    """Delete what a landed cut took off the stream, then its record (step 3). Returns the ledgers deleted."""
    return _delete(lc, cut, password)


def clean_cuts(lc: LedgerClient, name: str, *, password: bytes = b"") -> int:
    """Finish the stream's cuts whose process died before deleting their ledgers, and delete planned records
    whose process is gone, or that are lc's own with no run of this process going (see the module docstring).
    Lists the stream's cut records only (none, unless a run died or failed). Returns how many cuts it finished."""
    try:
        children = lc.store.children(layout.stream_cuts_path(name))
    except NoNodeError:
        return 0
    finished = 0
    for child in sorted(children):
        found = lc.store.read(layout.stream_cut_path(name, child), Cut.decode)
        if found is None:
            continue
        cut = found.value
        if cut.state == CUT:
            _delete(lc, cut, password)
            finished += 1
        elif _abandoned(lc, cut):
            _forget_planned(lc.store, cut)
    return finished


def _abandoned(lc: LedgerClient, planned: Cut) -> bool:
    """Whether a planned record's run has ended without it: its process is gone, or it is lc's own and no run of
    this process is going with it."""
    if planned.writer == lc.writer_id:
        with _in_flight_lock:
            return planned.path not in _in_flight
    return not registry.writer_alive(lc.store, planned.writer)


def held_bytes(store: MetadataStore, record: StreamRecord) -> int:
    """The bytes of the closed ledgers of the stream whose head is record: retention's count, plus the lengths
    of the ledgers after it (every ledger's, for a stream without a size retention)."""
    return _counted(store, record, _LedgerFacts(store)).bytes


def pending_cuts(store: MetadataStore, name: str) -> list[Cut]:
    """The stream's cut records (planned, or cut and not yet deleted)."""
    try:
        children = store.children(layout.stream_cuts_path(name))
    except NoNodeError:
        return []
    found = (store.read(layout.stream_cut_path(name, child), Cut.decode) for child in sorted(children))
    return [record.value for record in found if record is not None]


# -- where a cut ends -----------------------------------------------------------------------------------


def _check_open_tail(record: StreamRecord, before_offset: int) -> None:
    last = record.last_ledger
    if last is not None and last.last_offset is None and before_offset > last.first_offset:
        raise TruncateOpenLedgerError(
            f"stream {record.name!r}: offsets from {last.first_offset} are in ledger {last.ledger_id}, which is "
            f"OPEN{f' (its owner {record.owner} writes it)' if record.owner else ''}; a truncation removes whole "
            f"closed ledgers only: truncate --before {last.first_offset} or less, or close the stream's writer "
            "(or let a reader recover its ledger) and truncate again"
        )


def _first_kept(store: MetadataStore, record: StreamRecord, before_offset: int) -> int:
    """The first offset of the ledger holding before_offset (offsets are contiguous), or the stream's next
    offset if it holds none that high: the point a truncation before before_offset moves first_offset to."""
    for ledger in iter_ledgers(store, record, before_offset, before_offset):
        return ledger.first_offset
    return record.next_offset


def _retained_from(
    store: MetadataStore, record: StreamRecord, facts: "_LedgerFacts", now: float,
) -> tuple[int, ByteCount | None]:
    """Where the stream starts once its retention is applied, and the byte count from there."""
    retention = record.retention
    count = _counted(store, record, facts) if retention.max_bytes is not None else None
    total = count.bytes if count is not None else 0
    first = record.first_offset
    if retention.max_age is None and total <= retention.max_bytes:
        return first, count   # under its size and no age: no ledger of the front is looked at
    last = record.last_ledger
    for ledger in _read_ahead(iter_ledgers(store, record, record.first_offset), facts, retention):
        if ledger.last_offset is None:
            break
        expired = retention.max_age is not None and facts.mtime(ledger) <= now - retention.max_age
        excess = retention.max_bytes is not None and total > retention.max_bytes and ledger != last
        if not (expired or excess):
            break
        if count is not None:
            total -= facts.length(ledger)
        first = ledger.last_offset + 1
    if count is None:
        return first, _count_after(store, record, first, facts)
    return first, ByteCount(first, max(count.end_offset, first), total)


def _worth_storing(record: StreamRecord, count: ByteCount | None) -> bool:
    """Whether a run that cuts nothing stores its byte count in the head (a CAS of the head alone): when the head
    has no valid count (it was counted from the stream's first offset: the next runs would count it all again), or
    when COUNT_LEDGERS ledgers or more were counted since the stored one. Below that, the next run counts those
    few again rather than this one writing the head on every pass of a retention loop."""
    stored = record.byte_count
    if count is None or count == stored:
        return False
    if stored is None or stored.first_offset != record.first_offset or stored.end_offset < record.tail_offset:
        return True   # no valid count; or ledgers counted since it were sealed: once, it then reaches the tail
    counted = [s for s in record.tail if s.last_offset is not None and stored.end_offset <= s.first_offset
               and s.last_offset < count.end_offset]
    return len(counted) >= COUNT_LEDGERS


def _read_ahead(ledgers: Iterator[StreamLedger], facts: "_LedgerFacts", retention: Retention) -> Iterator[StreamLedger]:
    """The ledgers, with the facts retention needs read CHUNK_LEDGERS at a time, in parallel."""
    while chunk := list(itertools.islice(ledgers, CHUNK_LEDGERS)):
        facts.fetch(chunk, mtime=retention.max_age is not None, length=retention.max_bytes is not None)
        yield from chunk


def _counted(store: MetadataStore, record: StreamRecord, facts: "_LedgerFacts") -> ByteCount:
    """The byte count of the stream's closed ledgers, from the head's count (valid if it starts at the stream's
    first offset) plus the lengths of the closed ledgers after it: O(ledgers added since it was made)."""
    count = record.byte_count
    if count is None or count.first_offset != record.first_offset:
        count = ByteCount(record.first_offset, record.first_offset, 0)
    added = list(itertools.takewhile(lambda s: s.last_offset is not None,
                                     iter_ledgers(store, record, count.end_offset)))
    facts.fetch(added, length=True)
    end = added[-1].last_offset + 1 if added else count.end_offset
    return ByteCount(count.first_offset, max(end, count.end_offset), count.bytes + sum(map(facts.length, added)))


def _count_after(store: MetadataStore, record: StreamRecord, first: int, facts: "_LedgerFacts") -> ByteCount | None:
    """The head's byte count once the stream starts at first: the counted ledgers below first subtracted
    (their lengths read: O(removed)); None if the head has no valid count."""
    count = record.byte_count
    if count is None or count.first_offset != record.first_offset:
        return None
    below = min(first, count.end_offset)
    removed = [s for s in iter_ledgers(store, record, record.first_offset, below - 1)
               if s.last_offset is not None and s.last_offset < below] if below > record.first_offset else []
    facts.fetch(removed, length=True)
    return ByteCount(first, max(count.end_offset, first), count.bytes - sum(map(facts.length, removed)))


class _LedgerFacts:
    """Lengths and last-write times of ledgers, read in parallel once each (a closed ledger's do not change)."""

    def __init__(self, store: MetadataStore):
        self.store = store
        self._length: dict[int, int] = {}
        self._mtime: dict[int, float] = {}

    def fetch(self, ledgers: list[StreamLedger], *, mtime: bool = False, length: bool = False) -> None:
        jobs = [(self._read_mtime, s.ledger_id) for s in ledgers if mtime and s.ledger_id not in self._mtime]
        jobs += [(self._read_length, s.ledger_id) for s in ledgers if length and s.ledger_id not in self._length]
        if len(jobs) <= 1:
            for read, ledger_id in jobs:
                read(ledger_id)
            return
        with concurrent.futures.ThreadPoolExecutor(min(READ_THREADS, len(jobs))) as pool:
            for future in [pool.submit(read, ledger_id) for read, ledger_id in jobs]:
                future.result()

    def length(self, ledger: StreamLedger) -> int:
        return self._length[ledger.ledger_id]

    def mtime(self, ledger: StreamLedger) -> float:
        return self._mtime[ledger.ledger_id]

    def _read_length(self, ledger_id: int) -> None:
        self._length[ledger_id] = max(0, self.store.read_ledger(ledger_id).value.length)

    def _read_mtime(self, ledger_id: int) -> None:
        mtime = self.store.modified_at(layout.ledger_path(ledger_id))
        if mtime is None:
            raise LedgerError(
                f"ledger {ledger_id} is in its stream but has no metadata: the stream and the ledgers disagree; "
                "run `ledger stream show` on the stream and check what deleted the ledger"
            )
        self._mtime[ledger_id] = mtime
