"""Batch writes: every task is a ledger writer; the driver commits all task ledgers in one CAS.

prepare() runs on the driver before any task: it checks the stream's format, schema and password,
recovers a dangling tail, creates the stream if it is new, cleans what jobs and queries of drivers that
died left on it (janitor.py), and starts the job (jobs.py), naming the driver (driver.py). A task
names its ledger in the job's registry, then creates it, tagged with stream, job, partition and
attempt, appends Arrow entries pipelined, closes it and reports it (TaskLedger). commit() ends the
job, discards every ledger in the job's registry that is not reported (failed, speculative or dead
attempts), registers the reported ones with the job id in one CAS, removes the registry and, for
overwrite, deletes the replaced ledgers. abort() ends the job, records it as aborted unless its commit
landed, and discards every ledger in the registry that the stream does not hold. Neither looks at any
ledger outside the job's registry (rule 15).

A commit whose reply was lost has an unknown outcome, not a failed one (DESIGN rule 16): commit()
reads back whether its job id landed and reports success if it did, so a retry cannot duplicate rows;
abort() syncs, then decides in a CAS of its own (commit.py), and never deletes a ledger that a landed
commit registered. The stream exists from prepare() on, so the commit is always one CAS on an
existing record, which that abort can fence (a create could land after the abort decided).
"""
from __future__ import annotations

import collections
import contextlib
import logging
import uuid
from typing import Iterator

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from connector.client import LedgerClient, NotEnoughNodesError, entry_time
from connector.client.placement import writable
from connector.retention import Cut, finish_cut, overwrite_cut
from connector.spark.commit import (
    COMMITTED, TaskLedger, check_arrow_stream, check_last_ledger_closed, committed_job, job_outcome,
    new_stream,
)
from connector.spark.driver import driver_registration_ahead, registered_driver
from connector.spark.encoding import EntryBuilder, entries_of, entry_header
from connector.spark.errors import WriteJobCommittedError
from connector.spark.janitor import clean_stream, record_aborted
from connector.spark.jobs import (
    EntryChecks, TaskEntry, TaskRegistry, WriteJobEndedError, commit_guard, create_task_ledger, drop_entry, end_job,
    forget_entry, job_registry, register_task_ledger, remove_job, start_job, sweep_entries, task_entries, withdraw,
)
from connector.spark.options import LedgerOptions
from connector.spark.recovery import (
    ATTEMPT_TAG, JOB_TAG, PARTITION_TAG, STREAM_TAG, TASK_TAG, check_password, discard,
)
from connector.spark.row_index import ROW_INDEX_KEY, RowIndexBuilder
from connector.spark.schema import appendable_schema, arrow_schema_of, decode_schema
from connector.spark.spans import stream_spans
from connector.spark.task_client import driver_client, write_task_client
from metadata import layout, registry
from metadata.errors import LedgerError
from metadata.model import StreamRecord
from metadata.store import MetadataStore
from metadata.streams import Rewrite, create_directory, find_stream, held_ledgers, update_stream

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 32  # entries appended and not yet acknowledged, per task (bounds memory to ~32 entries)


class LedgerWriter(DataSourceArrowWriter):
    """Pickled to executors: options, the Arrow schema, the job id; never a client."""

    def __init__(self, options: LedgerOptions, schema: pa.Schema, job_id: str, overwrite: bool):
        self.options = options
        self.schema = schema
        self.job_id = job_id
        self.overwrite = overwrite

    @classmethod
    def prepare(cls, options: LedgerOptions, schema: StructType, overwrite: bool) -> "LedgerWriter":
        """Driver, before any task: everything that can fail fails here, with nothing written."""
        arrow = arrow_schema_of(schema)
        with driver_registration_ahead(options.metadata), driver_client(options) as lc:
            check_target(lc, options, arrow, overwrite)
            ensure_stream(lc.store, options.stream)
            clean_stream(lc, options.stream, options.password)  # the janitor: jobs on it whose driver is gone
            job_id = uuid.uuid4().hex
            with registered_driver(lc.store, options.metadata) as driver_id:
                start_job(lc.store, job_id, options.stream, driver_id)
        return cls(options, arrow, job_id, overwrite)

    # -- executors -----------------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskLedger:
        ctx = TaskContext.get()
        return write_task_ledger(self.options, self.schema, iterator, ctx, self._tags(ctx), job_registry(self.job_id))

    def _tags(self, ctx: TaskContext) -> dict[str, object]:
        return {
            STREAM_TAG: self.options.stream, JOB_TAG: self.job_id, PARTITION_TAG: ctx.partitionId(),
            ATTEMPT_TAG: ctx.attemptNumber(), TASK_TAG: ctx.taskAttemptId(),
        }

    # -- driver --------------------------------------------------------------------------------

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Register the reported task ledgers; a lost reply is read back, never reported failed (rule 16)."""
        tasks = [m for m in messages if isinstance(m, TaskLedger)]
        kept = {t.ledger_id for t in tasks if t.ledger_id is not None}
        opts = self.options
        with driver_client(opts) as lc:
            end_job(lc.store, self.job_id)
            for entry in task_entries(lc.store, job_registry(self.job_id)):
                if entry.ledger_id not in kept:
                    drop_entry(lc, entry, opts.password)
            if self.overwrite:   # its cut's record goes there, in the commit's multi (older streams have none)
                create_directory(lc.store, opts.stream, layout.stream_cuts_path(opts.stream))
            replaced = self._register(lc.store, tasks)
            # The rows are committed: from here on nothing may raise (abort would run and must not follow).
            try:
                remove_job(lc.store, self.job_id)
            except LedgerError as exc:
                log.warning("write job %s: its registry was not removed: %s", self.job_id, exc)
            if replaced is not None:
                try:
                    finish_cut(lc, replaced, opts.password)
                except LedgerError as exc:
                    log.warning("overwrite of stream %r: replaced ledgers not all deleted (the stream's next job "
                                "start, truncation or retention run goes on): %s", opts.stream, exc)

    def _register(self, store: MetadataStore, tasks: list[TaskLedger]) -> Cut | None:
        """One CAS puts every task ledger and the job id on the stream; returns the cut an overwrite made (the
        ledgers of the head it replaced, in its tail and pages, are to be deleted; its record is written in the
        same multi), None for an append.

        A lost reply is read back (rule 16): if the job is found committed, the CAS that landed is the last
        one transform built, and `replaced` still holds the cut that one made.
        """
        replaced: list[Cut] = []
        registry = job_registry(self.job_id)
        ledger_ids = [task.ledger_id for task in tasks if task.ledger_id is not None]
        entries = EntryChecks(store, registry, ledger_ids, lambda: WriteJobEndedError(
            f"write job {self.job_id}: a sweep withdrew task ledgers of it before its commit reached stream "
            f"{self.options.stream!r}: none of its rows were committed; run the write again"))

        def transform(record: StreamRecord) -> Rewrite | None:
            guard = commit_guard(store, registry.path)
            if guard is not None and guard.committed:
                return None   # landed: its multi stamped the registry (the head may no longer hold the job's outcome)
            if (guard is None or guard.fenced) and ledger_ids and held_ledgers(store, record, ledger_ids):
                return None   # landed, its reply lost; a janitor then fenced and removed the registry (it keeps what
                #               the stream holds, and another may have marked the job aborted since): the rows are
                #               committed (rule 16), not to be written again
            updated = committed_job(record, self.job_id, tasks, self.schema, self.overwrite)
            if updated is None:
                return None
            if guard is None or guard.fenced:
                # A janitor found the job's driver gone: it fenced the job's registry, recorded the job aborted and
                # discarded its ledgers, then removed the registry. The head keeps only the newest JOBS_KEPT job
                # outcomes: once as many jobs have ended on the stream, the registry's fence (or absence) says so.
                raise WriteJobEndedError(
                    f"write job {self.job_id} was ended by a janitor (its driver's registration had ended) before its "
                    f"commit reached stream {record.name!r}: none of its rows were committed and its ledgers are "
                    "deleted; run the write again")
            replaced[:] = [overwrite_cut(record, self.job_id)] if self.overwrite else []
            # In the commit's multi: the registry stamped committed at the version read (fenced or removed since, the
            # multi fails and this runs again), each task ledger's entry not withdrawn (no sweep deleted it), and an
            # overwrite's cut record.
            cut = tuple((cut.path, cut.encode(), None) for cut in replaced)
            return Rewrite(updated.replace(retention=self.options.retention(updated.retention)),  # retentionMs/Bytes
                           also=(guard.stamp_committed(),) + entries.writes() + cut)

        update_stream(store, self.options.stream, transform, read_back=True)
        return replaced[0] if replaced else None

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Discard the job's ledgers, except those a landed commit registered (rule 16). Spark aborts a job whose
        commit raised, also one whose commit landed and could not learn so (ZooKeeper out of reach past
        $LEDGER_ZK_WAIT_SECONDS: UpdateOutcomeUnknownError), and then reports the write failed: for a job whose
        commit landed the abort, once done, raises WriteJobCommittedError, which says the rows are committed and
        the write is not to be run again."""
        opts = self.options
        with driver_client(opts) as lc:
            end_job(lc.store, self.job_id)
            # Recorded aborted by this CAS unless the commit landed first (janitor.record_aborted); None if the
            # stream is gone. No commit of the job lands after the abort's mark: the record read with it is final.
            record = record_aborted(lc.store, opts.stream, self.job_id)
            # Held ledgers are looked up whatever the head says of the job: it keeps the newest JOBS_KEPT outcomes
            # only, and a commit that landed and then failed (ZooKeeper unreachable for its read-back) may have lost
            # its outcome since.
            kept, _ = sweep_entries(lc.store, task_entries(lc.store, job_registry(self.job_id)),
                                    lambda ledger_ids: held_ledgers(lc.store, record, ledger_ids) if record else set(),
                                    lambda ledger_id: discard(lc, ledger_id, opts.password))
            remove_job(lc.store, self.job_id)
        if kept or (record is not None and job_outcome(record, self.job_id) == COMMITTED):
            raise WriteJobCommittedError(
                f"write job {self.job_id}: its rows WERE committed to stream {opts.stream!r}, although Spark reports "
                "this write failed (its commit landed; Spark aborts a job whose commit raised, e.g. when ZooKeeper "
                "stayed out of reach for longer than $LEDGER_ZK_WAIT_SECONDS while the commit read back its "
                "outcome). Do NOT run this write again: its rows would be in the stream twice")


def ensure_stream(store: MetadataStore, name: str) -> StreamRecord:
    """Create the stream, empty, unless it exists: every commit is then a CAS on an existing record. The stream. A
    create whose reply was lost is read back (found, it is there)."""
    return update_stream(store, name, lambda record: None, create=new_stream(name), read_back=True).value


BATCH_REMEDY = ', or replace the stream\'s rows with mode("overwrite")'
STREAMING_REMEDY = ", or write the query to a new stream (a streaming sink only appends)"


def check_target(lc: LedgerClient, options: LedgerOptions, arrow: pa.Schema, overwrite: bool,
                 streaming: bool = False, nodes: bool = True) -> None:
    """The stream can take these rows: enough nodes (unless not nodes), a settled tail, a compatible schema, the
    password."""
    if nodes:
        _check_nodes(lc.store, options.ensemble_size)
    found = find_stream(lc.store, options.stream)
    if found is not None:
        record = _settled(lc, found.value, options)
        if not overwrite and record.schema:
            appendable_schema(record.name, decode_schema(record.schema), arrow,
                              STREAMING_REMEDY if streaming else BATCH_REMEDY)
        _check_password(lc, record, options.password)


def write_task_ledger(
    opts: LedgerOptions, schema: pa.Schema, iterator: Iterator[pa.RecordBatch], ctx: TaskContext,
    tags: dict[str, object], registry: TaskRegistry,
) -> TaskLedger:
    """An executor task's write: its own ledger of Arrow entries, appended pipelined, then closed.

    The ledger is named in the job's or query's registry before it is created (jobs.py), so the driver's
    sweep finds it whatever happens to this task. On any failure the task withdraws its entry and deletes
    its own ledger; the driver's sweep covers them if that fails too. The close stores the ledger's row
    index (row_index.py), so that a read starting inside the ledger skips the entries below its start.

    Every entry carries its append time (entry_time.py: one time for all rows of the entry, from the task's
    clock, never decreasing), and the close records the ledger's first and last time, so that time searches
    (startingTimestamp) and _timestamp filters choose ledgers from their metadata.
    """
    builder = EntryBuilder(schema, opts.entry_bytes, opts.compression,
                           max_bytes=opts.max_entry_bytes - entry_time.FRAME.size)
    row_index = RowIndexBuilder()
    times = entry_time.Stamper(entry_time.AppendClock())
    entry: TaskEntry | None = None
    ledger = None
    in_flight: collections.deque = collections.deque()
    with write_task_client(opts) as lc:
        try:
            for payload in entries_of(iterator, builder):
                if ledger is None:
                    entry = register_task_ledger(lc.store, registry)
                    ledger = create_task_ledger(
                        lc, entry, ensemble_size=opts.ensemble_size, write_quorum=opts.write_quorum,
                        ack_quorum=opts.ack_quorum, password=opts.password, custom_metadata=entry_time.marked(tags),
                    )
                row_index.add(entry_header(payload)[0])
                in_flight.append(ledger.append_async(times.stamp(payload)))
                if len(in_flight) >= MAX_IN_FLIGHT:
                    in_flight.popleft().result()
            for future in in_flight:
                future.result()
            if ledger is not None:
                ledger.close(custom_metadata={ROW_INDEX_KEY: row_index.index().encode(), **times.close_metadata()})
        except BaseException:
            if entry is not None:
                _delete_own(lc, entry, ledger)
            raise
    if ledger is None:
        return TaskLedger(ctx.partitionId(), None, 0, 0)
    return TaskLedger(ctx.partitionId(), ledger.ledger_id, builder.rows_written, ledger.last_add_confirmed + 1)


def _settled(lc: LedgerClient, record: StreamRecord, options: LedgerOptions) -> StreamRecord:
    """The stream with a dangling tail recovered and sealed; fails if it cannot take Spark rows."""
    check_arrow_stream(record)
    last = record.last_ledger
    if last is not None and last.last_offset is None:
        record, _ = stream_spans(lc, record, [last], options.password, recover_dangling=True)
    check_last_ledger_closed(record)
    return record


def _check_password(lc: LedgerClient, record: StreamRecord, password: bytes) -> None:
    if record.last_ledger is not None:
        check_password(lc.ledger_metadata(record.last_ledger.ledger_id), password, f"stream {record.name!r}")


def _check_nodes(store: MetadataStore, ensemble_size: int) -> None:
    # The same nodes placement may choose from: registered, not decommissioned, and writable.
    nodes = writable(registry.placeable_nodes(store))
    if len(nodes) < ensemble_size:
        raise NotEnoughNodesError(
            f"ensembleSize={ensemble_size} but only {len(nodes)} writable storage nodes are registered; "
            "lower ensembleSize (and writeQuorum/ackQuorum) or start more nodes"
        )


def _delete_own(lc: LedgerClient, entry: TaskEntry, ledger) -> None:
    """A failing task withdraws its entry and removes its own ledger at once (ledger is None if creating it
    failed); the driver's sweep covers both if this fails too."""
    with contextlib.suppress(LedgerError):
        if ledger is not None:
            ledger.close()
    with contextlib.suppress(LedgerError):
        if withdraw(lc.store, entry):
            lc.store.delete_ledger(entry.ledger_id)
            forget_entry(lc.store, entry)
