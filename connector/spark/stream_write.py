"""The exactly-once Structured Streaming sink: df.writeStream.format("ledger").start("events").

Every task of a micro-batch writes its own ledger with the Arrow writer path (write.py), tagged with
the query id and the batch id. The driver's commit registers the batch's task ledgers together with
(query id, batch id) in ONE ZooKeeper multi: the head's compare-and-set and the query's commit record
(metadata/query_commits.py: a znode per query beside the head, so a commit reads and writes only its
own). A batch id the stream already holds for the query is skipped (after a restart Spark may commit a
batch again) and the ledgers written for the replay are discarded. The query id comes from the
checkpoint, so it survives restarts.

A task names its ledger in the query's registry (/spark-queries/<query id>, jobs.py) before it creates
it. After every commit the sweep reads that registry: the ledgers of this query's batches up to this one
that the stream does not hold (failed attempts, a run killed before its commit, a replayed batch) are
fenced, recovered and deleted, and the entries of committed ones are removed, so the registry holds
only batches in flight and the sweep never looks at other ledgers (rule 15): nothing uncommitted ever
becomes visible, and nothing is left behind. Spark runs a commit on a fresh writer instance, so
everything the commit needs travels in the registry and the commit messages.

Each run of the query records its driver in the registry (driver.py). A run whose driver dies never
sweeps again: the next query or write job started on the stream, or `ledger jobs --apply`, finds its
driver gone, records the run aborted on the stream and cleans the registry (janitor.py); a commit of a
run recorded so (its driver was only cut off) is refused, and its abort leaves the registry alone. A
commit that finds its batch committed all the same (it landed before the fence, its reply lost) is
reported committed (rule 16) and leaves the registry alone too.

A commit whose reply was lost reads back whether it landed (DESIGN rule 16): finding its batch id with
its own ledgers in the stream, it is done (not a replay: its ledgers stay). It returns only once the
outcome is known, so no request of it can land later; abort syncs before it sweeps, so it sees
everything that landed.
"""
from __future__ import annotations

import logging
from typing import Iterator

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from connector.client import LedgerClient
from connector.spark.commit import ABORTED, TaskLedger, committed, job_outcome
from connector.spark.driver import driver_registration_ahead, registered_driver
from connector.spark.janitor import clean_stream, held_by_their_streams, retire_gone_runs, run_key
from connector.spark.errors import SchemaMismatchError, StreamOwnedError, UnsupportedStreamFormatError
from connector.spark.options import LedgerOptions
from connector.spark.jobs import (
    EntryChecks, WriteJobEndedError, commit_guard, forget_entry, query_registry, restart_run, run_of, run_path,
    start_query, sweep_entries, task_entries,
)
from connector.spark.recovery import ATTEMPT_TAG, PARTITION_TAG, STREAM_TAG, TASK_TAG, discard
from connector.spark.schema import arrow_schema_of
from connector.spark.stream_options import StreamOptions
from connector.spark.task_client import driver_client
from connector.spark.write import check_target, ensure_stream, write_task_ledger
from metadata import layout
from metadata.errors import LedgerError
from metadata.model import StreamRecord
from metadata.query_commits import committing, evict, read_query_commit
from metadata.streams import Rewrite, ZnodeWrite, find_stream, held_ledgers, update_stream

log = logging.getLogger(__name__)

QUERY_TAG = "spark.query"
BATCH_TAG = "spark.batch"
BATCH_PROPERTY = "streaming.sql.batchId"  # the local property Spark sets on a micro-batch's tasks
REFUSALS = (StreamOwnedError, UnsupportedStreamFormatError, SchemaMismatchError)


class LedgerStreamWriter(DataSourceStreamArrowWriter):
    """Pickled to executors: options, the Arrow schema and the query id; never a client."""

    def __init__(self, options: LedgerOptions, schema: pa.Schema, query_id: str, driver_id: str = "", run: str = ""):
        self.options = options
        self.schema = schema
        self.query_id = query_id
        self.driver_id = driver_id  # the run's driver (driver.py): a janitor that finds it gone fences the run
        self.run = run              # the run's id: a run restarted after a fence has a new one

    @classmethod
    def prepare(cls, options: LedgerOptions, stream_options: StreamOptions, schema: StructType) -> "LedgerStreamWriter":
        arrow = arrow_schema_of(schema)
        query_id = stream_options.query_id()
        with driver_registration_ahead(options.metadata), driver_client(options) as lc:
            # Spark asks for a writer again for every micro-batch's commit: those find their run recorded, and check
            # no nodes (a commit writes to ZooKeeper only, and must not fail a batch whose rows are written because a
            # node is down now). Only the query's start runs the janitor (jobs and queries on the stream whose driver
            # is gone), which reads every registry of the cluster.
            with registered_driver(lc.store, options.metadata) as driver_id:
                run = run_of(lc.store, query_id, driver_id)
            check_target(lc, options, arrow, overwrite=False, streaming=True, nodes=run is None)
            head = ensure_stream(lc.store, options.stream)
            if run is None:
                clean_stream(lc, options.stream, options.password, own_query=query_id)
                with registered_driver(lc.store, options.metadata) as driver_id:
                    run_id = start_query(lc.store, query_id, options.stream, driver_id)
                try:
                    retire_gone_runs(lc.store, query_id, driver_id)
                except LedgerError as exc:   # the next start retires them
                    log.warning("streaming query %s: runs of gone drivers not retired: %s", query_id, exc)
            elif run.value.fenced or _marked(head, query_id, driver_id, run.value.run):
                log.warning("streaming query %s: a janitor fenced its run by driver %s (it found the driver's "
                            "registration gone for a while): its batches in flight are refused; a new run starts",
                            query_id, driver_id)
                run_id = restart_run(lc.store, query_id, options.stream, driver_id, run)
            else:
                run_id = run.value.run
        return cls(options, arrow, query_id, driver_id, run_id)

    # -- executors -----------------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskLedger:
        ctx = TaskContext.get()
        batch_id = int(ctx.getLocalProperty(BATCH_PROPERTY))
        return write_task_ledger(self.options, self.schema, iterator, ctx, self._tags(ctx, batch_id),
                                 query_registry(self.query_id, batch_id, reopen=self._reopen))

    def _reopen(self, store) -> None:
        """The query's registry and this driver's run, again (a janitor removed them: jobs.register_task_ledger)."""
        start_query(store, self.query_id, self.options.stream, self.driver_id)

    def _tags(self, ctx: TaskContext, batch_id: int) -> dict[str, object]:
        return {
            STREAM_TAG: self.options.stream, QUERY_TAG: self.query_id, BATCH_TAG: batch_id,
            PARTITION_TAG: ctx.partitionId(), ATTEMPT_TAG: ctx.attemptNumber(), TASK_TAG: ctx.taskAttemptId(),
        }

    # -- driver --------------------------------------------------------------------------------

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        tasks = [m for m in messages if isinstance(m, TaskLedger)]
        kept = {t.ledger_id for t in tasks if t.ledger_id is not None}
        with driver_client(self.options) as lc:
            try:
                replayed, fenced = self._register(lc, tasks, batchId)
            except REFUSALS:
                # Refused before anything was written to the stream: the batch's ledgers cannot stay.
                self._sweep(lc, batchId, registered=set())
                raise
            if fenced:
                log.warning("stream %r: batch %d of %s is committed; a janitor has since fenced this run (its "
                            "driver's registration ended), so its registry is left to the janitor",
                            self.options.stream, batchId, self.query_id)
                return
            if replayed:
                log.info("stream %r: batch %d of %s was committed before; discarding its replay",
                         self.options.stream, batchId, self.query_id)
            # The batch is on the stream: from here on nothing may raise (rule 16: a landed commit is not
            # reported failed). What this sweep leaves, the next batch's sweep or an abort's finds.
            try:
                self._sweep(lc, batchId, registered=set() if replayed else kept)
            except LedgerError as exc:
                log.warning("stream %r: batch %d of %s is committed, but its registry was not swept: %s",
                            self.options.stream, batchId, self.query_id, exc)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        with driver_client(self.options) as lc:
            lc.store.sync(layout.stream_path(self.options.stream))
            if self._fenced(lc):
                return  # a janitor cleaned this run's registry; a new run of the query may be using it now
            self._sweep(lc, batchId, registered=set())

    def _register(self, lc: LedgerClient, tasks: list[TaskLedger], batch_id: int) -> tuple[bool, bool]:
        """One multi: the task ledgers on the head and the batch id in the query's commit record. Returns (replayed:
        the batch was committed already, by an earlier run; fenced: it was committed, by this commit or before,
        and a janitor has fenced this run since). A batch not committed by a fenced run is refused."""
        found_committed = [False]
        fenced = [False]
        created = [False]   # a query record: the query's first commit, or records moved out of an older head

        ledger_ids = [t.ledger_id for t in tasks if t.ledger_id is not None]
        registering = bool(ledger_ids)
        entries = EntryChecks(lc.store, query_registry(self.query_id, batch_id), ledger_ids, lambda: WriteJobEndedError(
            f"streaming query {self.query_id}: a sweep (a janitor that found a driver registration of the query gone) "
            f"withdrew task ledgers of batch {batch_id} before its commit; the batch was not committed. Restart the "
            "query from its checkpoint"))

        def transform(record: StreamRecord) -> Rewrite | None:
            run_checks = self._run_checks(lc, record, registering)
            fenced[0] = run_checks is None
            commit = read_query_commit(lc.store, record, self.query_id)
            found_committed[0] = commit.holds(batch_id)
            if found_committed[0]:
                return None   # landed (also before a fence: rule 16, it is not reported failed), or a replay
            if fenced[0]:
                raise WriteJobEndedError(
                    f"streaming query {self.query_id}: a janitor found this run's driver gone (its liveness "
                    f"registration {self.driver_id} ended) and discarded its uncommitted batches; batch {batch_id} "
                    "was not committed. Restart the query from its checkpoint"
                )
            head, writes = committing(committed(record, tasks, self.schema, False), commit, batch_id)
            created[0] = any(version is None for _, _, version in writes)
            # Checked in the multi too: the run (fenced since, this runs again) and each task ledger's entry (withdrawn
            # by a sweep: then its ledger may be deleted).
            writes += run_checks + entries.writes()
            return Rewrite(head.replace(retention=self.options.retention(head.retention)),  # retentionMs/Bytes
                           also=writes)

        head = update_stream(lc.store, self.options.stream, transform, read_back=True).value
        if not found_committed[0]:
            if created[0]:   # never raises: the batch is committed
                evict(lc.store, self.options.stream, spare=layout.stream_query_path(self.options.stream,
                                                                                     self.query_id))
            return False, False
        if fenced[0]:
            return False, True
        # Committed before: by this commit, whose reply was lost (its ledgers are in the stream), or a replay.
        return not held_ledgers(lc.store, head, [t.ledger_id for t in tasks if t.ledger_id is not None]), False

    def _sweep(self, lc: LedgerClient, batch_id: int, registered: set[int]) -> None:
        """Go through the query's registry up to batch_id: forget the entries of ledgers the stream holds,
        discard the others' ledgers. registered: ledgers this commit just put on the stream (not looked up)."""
        entries = task_entries(lc.store, query_registry(self.query_id), through_batch=batch_id)
        for entry in entries:
            if entry.ledger_id in registered:
                forget_entry(lc.store, entry)
        sweep_entries(lc.store, [e for e in entries if e.ledger_id not in registered],
                      lambda ledger_ids: held_by_their_streams(lc.store, [self.options.stream], ledger_ids),
                      lambda ledger_id: discard(lc, ledger_id, self.options.password))

    def _fenced(self, lc: LedgerClient) -> bool:
        """Whether a janitor fenced this run (it found the run's driver gone): an abort then leaves the registry to
        it, since a later run of the query may have entries there now."""
        found = find_stream(lc.store, self.options.stream) if self.driver_id else None
        return found is not None and self._run_checks(lc, found.value, registering=True) is None

    def _run_checks(self, lc: LedgerClient, record: StreamRecord, registering: bool) -> tuple[ZnodeWrite, ...] | None:
        """None if a janitor found this run's driver gone: it fences the run in the query's registry, records the run
        aborted on the head, discards the run's ledgers, then removes the run. The head keeps the newest JOBS_KEPT
        outcomes only, so once as many batch jobs have ended on the stream the mark is gone; the run's fence (or
        absence, or its replacement by a new run of the same driver, with a new run id) stays. A commit that
        registers ledgers (they
        may be the ones discarded) is fenced by either, an empty one, which registers none, by the mark only. Else
        what the commit's multi checks of the run: its znode at the version read (a commit registering ledgers)."""
        if not self.driver_id:
            return ()
        if _marked(record, self.query_id, self.driver_id, self.run):
            return None
        if not registering:
            return ()
        guard = commit_guard(lc.store, run_path(self.query_id, self.driver_id))
        if guard is None or guard.fenced or guard.fields.get("run", "") != self.run:
            return None   # fenced, removed, or fenced and restarted as a new run
        return (guard.check(),)


def _marked(record: StreamRecord, query_id: str, driver: str, run: str) -> bool:
    """Whether a janitor recorded the run aborted on the stream (janitor.run_key): with its fence on the run's znode,
    what ends a run (prepare restarts such a run; its commits are refused)."""
    return job_outcome(record, run_key(query_id, driver, run)) == ABORTED
