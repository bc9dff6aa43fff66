"""Compaction of a stream's small ledgers (issue 14 item 4): runs of small closed ledgers rewritten into large
ones with the same rows at the same offsets, swapped into the stream in one compare-and-set.

A streaming sink makes one ledger per task per micro-batch, and every later read pays per ledger it opens.
A compaction run goes through these steps; a process that dies after any of them leaves the stream whole,
and the next run of the same stream (clean_compactions, which every compaction calls first) finishes or
undoes what it left:

1. plan: the stream's runs of closed ledgers under small_bytes, packed into groups of at most target_bytes,
   one new ledger each (E/WQ/AQ of the ledgers replaced). Never the stream's last ledger, and never a ledger
   still in a Spark task registry: its commit is in progress and may still read back whether the stream
   holds it (rule 16).
2. record: /compactions/<stream>@<id> names the run (ledger ids and offsets), the process's writer id (an
   ephemeral znode while it lives) and its grace period; state running, at version 0.
3. rewrite: every new ledger is registered under the record before it is created, as a Spark task registers
   its ledger (connector/spark/jobs.py): an allocated id, an entry created while the record is at version
   0, the ledger created while the entry is at version 0. It is tagged with the stream and the compaction.
   Arrow rows are re-batched into entries of entry_bytes (cut smaller where that is over the client's entry
   limit), with a row index; raw entries are copied one for one, so a raw ledger's entries still map 1:1 to
   offsets. The copy must hold exactly the run's offsets.
   Entry times (connector/client/entry_time.py) are kept exactly when every ledger of the group has them:
   a raw entry keeps its own, and arrow rows are re-batched only with rows of the same time (an entry has
   one time), so compaction never changes a row's _timestamp; the new ledger records its earliest and
   latest time at close. Ledgers written before entry times existed are compacted among themselves, never
   with timed ones (a run ends where the format changes).
4. swap: one update_stream multi (streams.replace_run) that replaces the run by the new ledgers, adjusts
   retention's byte count (the new ledgers' lengths for the run's) and sets the record to swapped (the swap
   time, the pages it replaced) at version 0. Refused if the run changed
   (truncated, overwritten, compacted meanwhile): the new ledgers are then discarded. The record changes
   in the same step as the stream, so its state says whether the swap landed: a lost reply is read back.
5. after the grace, from the swap by ZooKeeper's clock (the record's mtime): the replaced ledgers and pages are
   deleted, then the record; by the next compaction of the stream, truncation or retention run on it (which
   deletes a tail run's at once when it cut off all of its offsets), or Spark job start on it (its janitor).
   `ledger stream delete` deletes every record of the stream and its ledgers (stream_deleted).

Undoing a running compaction (its own failure, or its process gone: no writer znode) bumps its record's
version (state abandoned) first. That fences it for good: its swap and its registrations check version 0.
Then its registered ledgers are withdrawn and discarded (jobs.drop_entry) and the record is deleted.

The grace (DEFAULT_GRACE, one hour): readers plan on ledger ids and read them later. A Spark batch read plans
in the driver and its tasks open the ledgers as they run; a streaming micro-batch plans, then reads; a
reader holding a head from before the swap still lists the replaced pages (streams.live_pages). So the
replaced ledgers and pages stay readable for the grace after the swap; a read planned longer ago than that
fails with "ledger does not exist" (never with wrong rows) and reads the compacted ledgers when run again.
An hour covers the batch jobs of a stream of this size with room; raise it for longer ones. The cost is the
run's bytes stored twice for that long.
"""
from __future__ import annotations

import bisect
import collections
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import time
import uuid
from typing import Callable, Iterator, Sequence

from kazoo.exceptions import NodeExistsError, NoNodeError

from connector.client import LedgerClient, NoSuchLedgerError, entry_time
from connector.spark.commit import ARROW
from connector.spark.encoding import EntryBuilder, decode_entry, entry_header
from connector.spark.errors import RowTooLargeError
from connector.spark.jobs import (
    TaskEntry, TaskRegistry, WriteJobEndedError, create_task_ledger, drop_entry, job_registry, query_registry,
    register_task_ledger, task_entries,
)
from connector.spark.recovery import JOB_TAG, STREAM_TAG, check_password, discard
from connector.spark.row_index import ROW_INDEX_KEY, RowIndexBuilder
from connector.spark.schema import decode_schema
from metadata import layout, registry, streams
from metadata.errors import LedgerError, MetadataConflictError, OffsetsGoneError
from metadata.model import ByteCount, LedgerMetadata, StreamLedger, StreamRecord, Versioned
from metadata.store import MetadataStore
from metadata.streams import RunChangedError, replace_run, update_stream

log = logging.getLogger(__name__)

MiB = 1024 * 1024
DEFAULT_TARGET_BYTES = 128 * MiB
DEFAULT_GRACE = 3600.0
DEFAULT_ENTRY_BYTES = 1 * MiB   # the Spark writer's default entryBytes
MAX_RUN_LEDGERS = 4096          # ledgers one swap replaces: keeps the record (~25 bytes a ledger) far below 1 MB
MAX_IN_FLIGHT = 32              # entries appended and not yet acknowledged
READ_AHEAD_BYTES = 32 * MiB     # of run ledgers read ahead of the copy
PLAN_THREADS = 8                # metadata reads in flight while planning
COMPACTION_TAG = "compaction"
QUERY_TAG, BATCH_TAG = "spark.query", "spark.batch"   # as stream_write tags a sink's task ledgers
RUNNING, SWAPPED, ABANDONED = "running", "swapped", "abandoned"
PENDING = "pending"   # a ledger that is not a candidate now and may become one (plan_start)


class CompactionAbandonedError(LedgerError):
    """The compaction's record was abandoned (by a cleanup that took its process for dead) or deleted: its new
    ledgers may not enter the stream."""


@dataclasses.dataclass(frozen=True)
class CompactionPolicy:
    """Which ledgers are rewritten and into what. small_bytes defaults to half of target_bytes (two small
    ledgers always fit in one new one); a run of fewer than min_ledgers small ledgers is left as it is."""

    target_bytes: int = DEFAULT_TARGET_BYTES
    small_bytes: int | None = None
    min_ledgers: int = 2
    grace: float = DEFAULT_GRACE
    entry_bytes: int = DEFAULT_ENTRY_BYTES
    compression: str | None = None

    @property
    def small(self) -> int:
        return self.small_bytes if self.small_bytes is not None else self.target_bytes // 2


@dataclasses.dataclass(frozen=True)
class Compaction:
    """A compaction's durable record, /compactions/<stream>@<id> (see the module docstring)."""

    compaction_id: str
    stream: str
    writer: str
    grace: float
    run: tuple[StreamLedger, ...]
    created_at: float
    state: str = RUNNING
    swapped_at: float | None = None   # as read (_read_record): the swap's time by ZooKeeper's clock
    ledgers: tuple[StreamLedger, ...] = ()   # the run's replacement, once swapped
    replaced_pages: tuple[str, ...] = ()     # the pages the swap replaced (layout.page_ref)

    @property
    def path(self) -> str:
        return layout.compaction_path(self.compaction_id)

    @property
    def registry(self) -> TaskRegistry:
        return TaskRegistry(self.path)

    @property
    def due(self) -> float | None:
        """When the replaced ledgers may be deleted (None until swapped)."""
        return None if self.swapped_at is None else self.swapped_at + self.grace

    def encode(self) -> bytes:
        body = dataclasses.asdict(self)
        body["run"] = [[s.ledger_id, s.first_offset, s.last_offset] for s in self.run]
        body["ledgers"] = [[s.ledger_id, s.first_offset, s.last_offset] for s in self.ledgers]
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> "Compaction":
        body = json.loads(data)
        body["run"] = tuple(StreamLedger(*row) for row in body["run"])
        body["ledgers"] = tuple(StreamLedger(*row) for row in body["ledgers"])
        body["replaced_pages"] = tuple(body["replaced_pages"])
        return cls(**body)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A ledger of the stream that may be rewritten: its offsets, size and quorums."""

    ledger: StreamLedger
    length: int
    quorum: tuple[int, int, int]
    timed: bool = False   # its entries carry append times

    @property
    def kind(self) -> tuple:
        """What the ledgers of one new ledger share: quorums and whether their entries carry times."""
        return self.quorum, self.timed


@dataclasses.dataclass(frozen=True)
class RunResult:
    compaction_id: str
    replaced: int                   # ledgers of the run
    ledgers: tuple[int, ...]        # their replacement
    first_offset: int
    last_offset: int
    bytes: int
    state: str                      # swapped, or abandoned (the run changed meanwhile)


@dataclasses.dataclass
class CompactionResult:
    stream: str
    runs: list[RunResult] = dataclasses.field(default_factory=list)
    finished: list[str] = dataclasses.field(default_factory=list)    # records whose old ledgers were deleted
    abandoned: list[str] = dataclasses.field(default_factory=list)   # records undone (their process was gone)
    pending: list[tuple[str, float]] = dataclasses.field(default_factory=list)  # (record, due) still in grace


# on_step(step, record) after each step: recorded, created (a new ledger, OPEN), written (all of them, closed),
# swapped, deleted (the replaced ledgers, after the grace), abandoned (undone)
Step = Callable[[str, Compaction], None]


def compact_stream(
    lc: LedgerClient, name: str, policy: CompactionPolicy = CompactionPolicy(), *, password: bytes = b"",
    wait: bool = False, on_step: Step | None = None,
) -> CompactionResult:
    """Clean up earlier compactions of the stream, then rewrite its runs of small ledgers, one swap each. With
    wait, also wait for the grace of these swaps and delete the ledgers they replaced; otherwise a later run
    (or clean_compactions) deletes them."""
    on_step = on_step or (lambda step, record: None)
    result = clean_compactions(lc, name, password=password, on_step=on_step)
    record = streams.read_stream(lc.store, name).value
    for run in plan_runs(lc, record, policy, password):
        result.runs.append(_compact_run(lc, record, run, policy, password, on_step))
    if wait:
        _wait_for_grace(lc, name, password, on_step, result)
    else:
        result.pending = [(c.compaction_id, c.due) for c in _records(lc, name) if c.state == SWAPPED]
    return result


# -- plan ----------------------------------------------------------------------------------------------


def plan_runs(
    lc: LedgerClient, record: StreamRecord, policy: CompactionPolicy, password: bytes
) -> list[list[list[Candidate]]]:
    """The stream's runs to rewrite, each a list of groups (one new ledger per group), in offset order. Looks at the
    ledgers from where the last plan under the same policy said nothing before can change (plan_start), not at
    every ledger of the stream (rule 15), and records where the next plan starts."""
    start = _plan_mark(lc.store, record, policy)
    ledgers = list(streams.iter_ledgers(lc.store, record, lo=start))
    planned = ledgers[:-1]   # the last ledger stays (replace_run)
    with concurrent.futures.ThreadPoolExecutor(PLAN_THREADS) as pool:
        looked = list(pool.map(lambda ledger: _candidate(lc, ledger, policy, password), planned))
    runs = runs_of([c if isinstance(c, Candidate) else None for c in looked], policy,
                   streams.book_starts(lc.store, record))
    if ledgers:
        _set_plan_mark(lc.store, record, policy, plan_start(planned, looked, runs, ledgers[-1].first_offset))
    return runs


def plan_start(ledgers: list[StreamLedger], looked: list["Candidate | None | str"], runs: list[list[list[Candidate]]],
               end: int) -> int:
    """Pure: where the next plan under the same policy starts, given this plan's ledgers (in offset order), what it
    found of each (a Candidate; None: stays as it is for good, not being small; PENDING: not a candidate yet, as an
    OPEN ledger or one a commit still holds) and the runs it chose; end: the first offset it
    did not plan (the stream's last ledger). Nothing before the result can join a run later: not a pending ledger
    nor the candidates just before it (they may join it once it is a candidate), not a run being rewritten now (its
    new ledgers may be small), not the candidates at the end (the next ledgers may join them). Candidates between
    ledgers that stay for good and that no run took never will be: their neighbours stay as they are."""
    starts = [end]
    starts += [runs[0][0][0].ledger.first_offset] if runs else []
    pending = [n for n, found in enumerate(looked) if found == PENDING][:1]
    for stop in pending + [len(looked)]:   # the candidates just before a pending ledger may join it, as at the end
        first = stop
        while first and isinstance(looked[first - 1], Candidate):
            first -= 1
        starts += [ledgers[first].first_offset] if first < len(looked) else []
    return min(starts)


def _plan_mark(store: MetadataStore, record: StreamRecord, policy: CompactionPolicy) -> int | None:
    """Where the last plan under this policy said the next starts; None (from the stream's start) for another, or a
    mark left by a plan of a stream deleted and created again under the name meanwhile."""
    found = store.read(layout.stream_compaction_mark_path(record.name), json.loads)
    if found is None or not isinstance(found.value, dict) or found.value.get("policy") != _policy_key(policy) or \
            found.value.get("created") != record.created_at:
        return None
    return int(found.value["offset"])


def _set_plan_mark(store: MetadataStore, record: StreamRecord, policy: CompactionPolicy, offset: int) -> None:
    name = record.name
    data = json.dumps({"offset": offset, "policy": _policy_key(policy), "created": record.created_at}).encode()
    try:
        try:
            store.create(layout.stream_compaction_mark_path(name), data)
        except NodeExistsError:
            store.set_data(layout.stream_compaction_mark_path(name), data)
    except (NoNodeError, LedgerError) as exc:   # the stream is gone, or ZooKeeper away: the next plan looks at more
        log.info("stream %r: where the next compaction plan starts was not recorded: %s", name, exc)


def _policy_key(policy: CompactionPolicy) -> list[int]:
    """What decides which ledgers a plan takes: another policy plans the whole stream again, once."""
    return [policy.small, policy.target_bytes, policy.min_ledgers]


def runs_of(candidates: list[Candidate | None], policy: CompactionPolicy,
            breaks: Sequence[int] = ()) -> list[list[list[Candidate]]]:
    """Pure: candidates in stream order (None: a ledger that stays) cut into runs of contiguous candidates with
    the same quorums and entry format (with or without times) and at most MAX_RUN_LEDGERS ledgers, each packed
    into groups of at most target_bytes; breaks (sorted) are offsets where books of the stream's pages start
    (streams.book_starts): a run never holds offsets on both sides of one (a new ledger may not straddle books).
    A run neither starts nor ends with a ledger without rows, nor with a group of one ledger (nothing to
    merge), and one of fewer than min_ledgers ledgers is dropped."""
    runs, current = [], []
    for candidate in candidates + [None]:
        if current and (candidate is None or candidate.kind != current[0].kind or len(current) == MAX_RUN_LEDGERS
                        or _book(breaks, candidate) != _book(breaks, current[0])):
            runs.append(_groups(current, policy.target_bytes))
            current = []
        if candidate is not None:
            current.append(candidate)
    return [run for run in map(_trimmed, runs) if sum(map(len, run)) >= max(2, policy.min_ledgers)]


def _book(breaks: Sequence[int], candidate: Candidate) -> int:
    """Which of the books starting at breaks the candidate's ledger is in (as streams.replace_run places it)."""
    return bisect.bisect_right(breaks, candidate.ledger.first_offset)


def _groups(run: list[Candidate], target_bytes: int) -> list[list[Candidate]]:
    groups, size = [[]], 0
    for candidate in run:
        if groups[-1] and size + candidate.length > target_bytes:
            groups.append([])
            size = 0
        groups[-1].append(candidate)
        size += candidate.length
    return groups


def _trimmed(groups: list[list[Candidate]]) -> list[list[Candidate]]:
    """groups without a group of one ledger at either end, nor a ledger without rows (streams.replace_run)."""
    while groups and (len(groups[0]) < 2 or not _holds_rows(groups[0][0])):
        groups = ([groups[0][1:]] if len(groups[0]) > 1 else []) + groups[1:]
    while groups and (len(groups[-1]) < 2 or not _holds_rows(groups[-1][-1])):
        groups = groups[:-1] + ([groups[-1][:-1]] if len(groups[-1]) > 1 else [])
    return groups


def _holds_rows(candidate: Candidate) -> bool:
    return candidate.ledger.last_offset >= candidate.ledger.first_offset


def _candidate(lc: LedgerClient, ledger: StreamLedger, policy: CompactionPolicy,
               password: bytes) -> Candidate | None | str:
    """The ledger as a Candidate; None if it stays as it is for good (not small); PENDING if it is not a candidate
    now but may become one (OPEN, a commit still holds it, or it left the stream meanwhile)."""
    if ledger.last_offset is None:
        return PENDING
    try:
        meta = lc.ledger_metadata(ledger.ledger_id)
    except NoSuchLedgerError:
        return PENDING  # left the stream meanwhile (truncated): the swap would be refused anyway
    if not meta.is_closed or _committing(lc, meta):
        return PENDING
    if meta.length >= policy.small:
        return None
    check_password(meta, password, f"stream ledger {ledger.ledger_id}")
    return Candidate(ledger, meta.length, (meta.ensemble_size, meta.write_quorum, meta.ack_quorum),
                     entry_time.carries_times(meta))


def _committing(lc: LedgerClient, meta: LedgerMetadata) -> bool:
    """Whether a Spark commit still has the ledger in its task registry (the sweep forgets it once done)."""
    tags = meta.custom
    if QUERY_TAG in tags and BATCH_TAG in tags:
        task_registry = query_registry(tags[QUERY_TAG], int(tags[BATCH_TAG]))
    elif JOB_TAG in tags:
        task_registry = job_registry(tags[JOB_TAG])
    else:
        return False
    return lc.store.exists(TaskEntry(task_registry.path, meta.ledger_id, task_registry.batch).path)


# -- one run -------------------------------------------------------------------------------------------


def _compact_run(
    lc: LedgerClient, stream: StreamRecord, groups: list[list[Candidate]], policy: CompactionPolicy,
    password: bytes, on_step: Step,
) -> RunResult:
    run = tuple(candidate.ledger for group in groups for candidate in group)
    compaction = Compaction(f"{stream.name}@{uuid.uuid4().hex[:12]}", stream.name, lc.writer_id, policy.grace, run,
                            time.time())
    try:
        # In the try: a create whose reply was lost may have landed, and the undo below removes it then. Left
        # RUNNING, only a cleanup that finds this process gone would (until 2026-11-29: for the process's life).
        lc.store.create(compaction.path, compaction.encode())
        on_step("recorded", compaction)
        written = [_rewrite(lc, stream, compaction, group, policy, password, on_step) for group in groups]
        on_step("written", compaction)
        replacement = tuple(ledger for ledger, _ in written)
        lengths = tuple(max(0, c.length) for group in groups for c in group), sum(length for _, length in written)
        swapped = _swap(lc, compaction, replacement, lengths)
    except (RunChangedError, CompactionAbandonedError, OffsetsGoneError) as exc:
        # OffsetsGoneError: a truncation deleted pages of the run while the swap read them: the run changed too
        log.info("compaction %s of stream %r left offsets %d..%d as they were: %s", compaction.compaction_id,
                 stream.name, run[0].first_offset, run[-1].last_offset, exc)
        swapped = _undo(lc, compaction, password, on_step)
        if swapped is None:
            return _result(compaction, (), ABANDONED, groups)
    except BaseException:
        with contextlib.suppress(LedgerError):
            _undo(lc, compaction, password, on_step)   # or left to the next run's cleanup
        raise
    on_step("swapped", swapped)
    return _result(swapped, swapped.ledgers, SWAPPED, groups)


def _result(compaction: Compaction, ledgers, state: str, groups: list[list[Candidate]]) -> RunResult:
    run = compaction.run
    return RunResult(compaction.compaction_id, len(run), tuple(s.ledger_id for s in ledgers), run[0].first_offset,
                     run[-1].last_offset, sum(c.length for group in groups for c in group), state)


def _rewrite(
    lc: LedgerClient, stream: StreamRecord, compaction: Compaction, group: list[Candidate],
    policy: CompactionPolicy, password: bytes, on_step: Step,
) -> tuple[StreamLedger, int]:
    """One new ledger holding the group's rows (registered under the compaction's record before it exists), and
    its length."""
    first, last = group[0].ledger.first_offset, group[-1].ledger.last_offset
    ensemble_size, write_quorum, ack_quorum = group[0].quorum
    tags = {STREAM_TAG: stream.name, COMPACTION_TAG: compaction.compaction_id}
    times = entry_time.Stamper(entry_time.AppendClock()) if group[0].timed else None   # a run has one format
    try:
        entry = register_task_ledger(lc.store, compaction.registry)
        handle = create_task_ledger(
            lc, entry, ensemble_size=ensemble_size, write_quorum=write_quorum, ack_quorum=ack_quorum,
            password=password, custom_metadata=entry_time.marked(tags) if times else tags,
        )
    except WriteJobEndedError as exc:
        raise CompactionAbandonedError(f"compaction {compaction.compaction_id} was abandoned by a cleanup") from exc
    on_step("created", compaction)
    with handle:
        copy = _ArrowCopy(stream, policy, lc.max_entry_bytes) if stream.format == ARROW else _RawCopy()
        in_flight: collections.deque = collections.deque()
        for ledger, entries in _read_ahead(lc, group, password):
            for payload, time_ms in copy.entries(ledger, entries):
                in_flight.append(handle.append_async(times.stamp(payload, time_ms) if times else payload))
                if len(in_flight) >= MAX_IN_FLIGHT:
                    in_flight.popleft().result()
        for payload, time_ms in copy.finish():
            in_flight.append(handle.append_async(times.stamp(payload, time_ms) if times else payload))
        for future in in_flight:
            future.result()
        if copy.offsets != last - first + 1:
            raise LedgerError(
                f"compaction {compaction.compaction_id}: ledgers {group[0].ledger.ledger_id}.."
                f"{group[-1].ledger.ledger_id} hold {copy.offsets} offsets, the stream gives them {last - first + 1}"
            )
        closed = handle.close(custom_metadata={**copy.custom_metadata(), **(times.close_metadata() if times else {})})
    return StreamLedger(handle.ledger_id, first, last), max(0, closed.length)


def _read_ahead(lc: LedgerClient, group: list[Candidate], password: bytes) -> Iterator[tuple[StreamLedger, list]]:
    """Each ledger of the group with its entries (payload and time), read a few ledgers (READ_AHEAD_BYTES) ahead."""
    def read(candidate: Candidate) -> list:
        handle = lc.open_ledger(candidate.ledger.ledger_id, password=password, recover=False)
        if handle.last_entry_id < 0:
            return []
        return list(handle.read(0, handle.last_entry_id))

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        pending: collections.deque = collections.deque()
        queued = 0
        for candidate in group:
            while pending and queued + candidate.length > READ_AHEAD_BYTES:
                done, future = pending.popleft()
                queued -= done.length
                yield done.ledger, future.result()
            pending.append((candidate, pool.submit(read, candidate)))
            queued += candidate.length
        for done, future in pending:
            yield done.ledger, future.result()


class _RawCopy:
    """Raw entries one for one: entry e of the new ledger is offset first + e, as in the ledgers it replaces."""

    def __init__(self) -> None:
        self.offsets = 0

    def entries(self, ledger: StreamLedger, entries: list) -> list[tuple[bytes, int | None]]:
        """(payload, time) of each entry, its own time kept."""
        _check_count(ledger, len(entries))
        self.offsets += len(entries)
        return [(entry.payload, entry.time_ms) for entry in entries]

    def finish(self) -> list[tuple[bytes, int | None]]:
        return []

    def custom_metadata(self) -> dict:
        return {}


class _ArrowCopy:
    """Arrow rows re-batched into entries of entry_bytes (the recorded schema), indexed as a Spark task does, and,
    as there, none larger than the client sends with its time frame (rows are cut into more entries)."""

    def __init__(self, stream: StreamRecord, policy: CompactionPolicy, max_entry_bytes: int):
        max_bytes = max_entry_bytes - entry_time.FRAME.size
        self.builder = EntryBuilder(decode_schema(stream.schema), min(policy.entry_bytes, max_bytes),
                                    policy.compression, max_bytes=max_bytes)
        self.row_index = RowIndexBuilder()
        self.time_ms: int | None = None   # the time of the rows pending in the builder

    @property
    def offsets(self) -> int:
        return self.builder.rows_written

    def entries(self, ledger: StreamLedger, entries: list) -> Iterator[tuple[bytes, int | None]]:
        rows = 0
        try:
            for entry in entries:
                if entry.time_ms != self.time_ms:
                    yield from self._indexed(self.builder.finish())   # an entry holds rows of one time
                    self.time_ms = entry.time_ms
                decoded = decode_entry(entry.payload)
                if decoded.first_row != rows:
                    raise LedgerError(f"ledger {ledger.ledger_id}: an entry starts at row {decoded.first_row}, "
                                      f"expected {rows}; the ledger is not a Spark arrow ledger")
                rows += decoded.row_count
                for batch in decoded.batches:
                    yield from self._indexed(self.builder.add(batch))
        except RowTooLargeError as exc:
            raise self._too_large(f"ledger {ledger.ledger_id}") from exc
        _check_count(ledger, rows)

    def finish(self) -> Iterator[tuple[bytes, int | None]]:
        try:
            yield from self._indexed(self.builder.finish())
        except RowTooLargeError as exc:
            raise self._too_large("the run's last rows") from exc

    def _too_large(self, where: str) -> LedgerError:
        return LedgerError(
            f"{where}: a row alone is over the entry limit of {self.builder.max_bytes:,} bytes (--max-entry-bytes "
            "less the time frame) in this compaction's --compression; nothing of the run was swapped in. Give "
            "--max-entry-bytes the storage nodes' value, or compress (--compression)")

    def _indexed(self, payloads: Iterator[bytes]) -> Iterator[tuple[bytes, int | None]]:
        for payload in payloads:
            self.row_index.add(entry_header(payload)[0])
            yield payload, self.time_ms

    def custom_metadata(self) -> dict:
        return {ROW_INDEX_KEY: self.row_index.index().encode()}


def _check_count(ledger: StreamLedger, offsets: int) -> None:
    if offsets != ledger.last_offset - ledger.first_offset + 1:
        raise LedgerError(
            f"ledger {ledger.ledger_id} holds {offsets} offsets, its stream gives it "
            f"{ledger.first_offset}..{ledger.last_offset}; leaving it uncompacted"
        )


def _swap(lc: LedgerClient, compaction: Compaction, replacement: tuple[StreamLedger, ...],
          lengths: tuple[tuple[int, ...], int]) -> Compaction:
    """The one CAS: the run replaced in the stream and the record set to swapped, in one multi, with retention's
    byte count adjusted (lengths: of the run's ledgers, and the replacement's bytes). A lost reply is read back: the
    record's state says whether it landed."""
    swapped: list[Compaction] = []

    def transform(head: StreamRecord):
        found = _read_record(lc, compaction.compaction_id)
        if found is None or found.value.state == ABANDONED:
            raise CompactionAbandonedError(f"compaction {compaction.compaction_id} was abandoned by a cleanup")
        if found.value.state == SWAPPED:
            swapped[:] = [found.value]
            return None
        rewrite = replace_run(lc.store, head, compaction.run, replacement)
        count = _count_swapped(head, compaction.run, *lengths)
        if count is not None:
            rewrite = dataclasses.replace(rewrite, head=rewrite.head.replace(byte_count=count))
        done = dataclasses.replace(compaction, state=SWAPPED, swapped_at=time.time(), ledgers=replacement,
                                   replaced_pages=tuple(layout.page_ref(page) for page in rewrite.replaced))
        return dataclasses.replace(rewrite, also=((compaction.path, done.encode(), 0),))

    update_stream(lc.store, compaction.stream, transform, read_back=True)
    return swapped[0] if swapped else _read_record(lc, compaction.compaction_id).value


def _count_swapped(head: StreamRecord, run: tuple[StreamLedger, ...], run_lengths: tuple[int, ...],
                   new_bytes: int) -> ByteCount | None:
    """Retention's byte count once the run is replaced, for a head whose valid count (from the stream's first
    offset) covers the run's start: the lengths of the run's counted ledgers swapped for the new ledgers' bytes, and
    the count then reaches the run's end. None when the count is not touched (invalid, or the run after it): there
    replace_run's head stands. Counted ledgers end below the count's end: it is a ledger boundary."""
    count = head.byte_count
    if count is None or count.first_offset != head.first_offset or run[0].first_offset >= count.end_offset:
        return None
    counted = sum(length for ledger, length in zip(run, run_lengths) if ledger.last_offset < count.end_offset)
    return ByteCount(count.first_offset, max(count.end_offset, run[-1].last_offset + 1),
                     count.bytes - counted + new_bytes)


# -- cleanup -------------------------------------------------------------------------------------------


def clean_compactions(
    lc: LedgerClient, name: str, *, password: bytes = b"", on_step: Step | None = None, now: float | None = None,
    first_offset: int | None = None,
) -> CompactionResult:
    """Finish the stream's swapped compactions whose grace has passed and undo those whose process is gone.
    Reads only the records of compactions in progress (rule 15); for a retention loop or janitor too.

    first_offset: the stream's first offset, given by a truncation or retention run after its cut. A swapped
    compaction of tail ledgers (its record alone names them: no page) whose whole run lies below it is finished at
    once, whatever its grace: its offsets left the stream, so a read planned on its ledgers gets failOnDataLoss, as
    for the ledgers the cut deleted (connector/spark/data_loss.py: a ledger gone below the stream's first offset).
    A run that starts in pages waits for its grace: the cut deletes the replaced pages' ledgers below the first
    offset with those pages (streams.drop_below), and a replaced page may hold offsets the stream still has."""
    on_step = on_step or (lambda step, record: None)
    result = CompactionResult(name)
    for compaction in _records(lc, name):
        if compaction.state == SWAPPED and (compaction.due <= (now or time.time()) or (
                first_offset is not None and not compaction.replaced_pages and
                compaction.run[-1].last_offset < first_offset)):
            _finish(lc, compaction, password)
            on_step("deleted", compaction)
            result.finished.append(compaction.compaction_id)
        elif compaction.state == ABANDONED or (
                compaction.state == RUNNING and not registry.writer_alive(lc.store, compaction.writer)):
            if _undo(lc, compaction, password, on_step) is None:
                result.abandoned.append(compaction.compaction_id)
    return result


def stream_deleted(lc: LedgerClient, name: str, password: bytes = b"") -> tuple[list[Compaction], list[str]]:
    """After the stream's head was deleted (`ledger stream delete`), its compaction records: no compaction can swap
    any more (its swap is one multi with the head's compare-and-set, and a head created again under the name is
    another znode than the one its run was read from: the run is not in it). A running or abandoned one is undone
    here (abandoned first, so that no registration of it lands after: then the ledgers registered under it are
    discarded and the record deleted). Returns the swapped records, whose replaced ledgers (run) and new ones the
    caller deletes and then the records, and what could not be undone (id: why)."""
    swapped, failed = [], []
    for compaction in _records(lc, name):
        if compaction.state != SWAPPED:
            try:
                compaction = _undo(lc, compaction, password, lambda step, record: None)
            except LedgerError as exc:
                failed.append(f"{compaction.compaction_id}: {exc}")
                continue
        if compaction is not None:
            swapped.append(compaction)
    return swapped, failed


def _records(lc: LedgerClient, name: str) -> list[Compaction]:
    prefix = f"{streams.check_stream_name(name)}@"
    found = (_read_record(lc, child) for child in sorted(lc.store.children(layout.COMPACTIONS))
             if child.startswith(prefix))
    return [record.value for record in found if record is not None]


def _read_record(lc: LedgerClient, compaction_id: str) -> Versioned[Compaction] | None:
    """The record; a swapped one with swapped_at its last write by ZooKeeper's clock (its mtime: the swap's multi is
    its last write), as retention by age judges a ledger's age, not by what the compacting host's clock said: before
    2026-11-29 a cleaner's clock running ahead of the compactor's by more than the grace deleted the replaced ledgers
    early. Records still carry the compactor's swapped_at, for older software, which judges by it."""
    found = lc.store.read_with_stat(layout.compaction_path(compaction_id), Compaction.decode)
    if found is None:
        return None
    compaction, stat = found
    if compaction.state == SWAPPED:
        compaction = dataclasses.replace(compaction, swapped_at=stat.mtime / 1000.0)
    return Versioned(compaction, stat.version)


def _finish(lc: LedgerClient, compaction: Compaction, password: bytes) -> None:
    """After the grace: the replaced ledgers, then the pages they were in, then the record (with the entries of
    the new ledgers, which the stream holds)."""
    for ledger in compaction.run:
        discard(lc, ledger.ledger_id, password)
    for page_ref in compaction.replaced_pages:
        lc.store.delete(layout.page_ref_path(compaction.stream, page_ref))
    lc.store.delete(compaction.path, recursive=True)


def _undo(lc: LedgerClient, compaction: Compaction, password: bytes, on_step: Step) -> Compaction | None:
    """Abandon a compaction that has not swapped (fencing it), discard the ledgers it registered, delete its
    record. Returns the swapped record instead if its swap had landed after all."""
    abandoned = dataclasses.replace(compaction, state=ABANDONED)
    try:
        lc.store.compare_and_set(compaction.path, abandoned.encode(), 0, f"compaction record {compaction.path}")
    except MetadataConflictError:
        found = _read_record(lc, compaction.compaction_id)
        if found is None:
            return None  # undone by another cleanup meanwhile
        if found.value.state == SWAPPED:
            return found.value
        # abandoned already, by a cleanup that may have died halfway: finish its work
    except NoNodeError:
        return None  # undone already
    for entry in task_entries(lc.store, compaction.registry):
        drop_entry(lc, entry, password)
    lc.store.delete(compaction.path, recursive=True)
    on_step("abandoned", abandoned)
    return None


def _wait_for_grace(lc: LedgerClient, name: str, password: bytes, on_step: Step, result: CompactionResult) -> None:
    """Sleep until the grace of this call's swaps has passed, deleting the replaced ledgers as they come due."""
    mine = {run.compaction_id for run in result.runs if run.state == SWAPPED}
    while True:
        due = [c.due for c in _records(lc, name) if c.state == SWAPPED and c.compaction_id in mine]
        if not due:
            return
        time.sleep(max(0.0, min(due) - time.time()))
        cleaned = clean_compactions(lc, name, password=password, on_step=on_step)
        result.finished += cleaned.finished
        result.abandoned += cleaned.abandoned


__all__ = [
    "CompactionPolicy", "Compaction", "CompactionResult", "RunResult", "compact_stream", "clean_compactions",
    "plan_runs", "runs_of", "DEFAULT_GRACE", "DEFAULT_TARGET_BYTES",
]
