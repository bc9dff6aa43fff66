"""Stream record transforms for committing Spark writes: pure functions fed to update_stream's CAS loop.

Offsets of an arrow stream count rows: a ledger holding n rows registered after offset k covers
k+1..k+n. A commit registers every task ledger of a job in partition order in one CAS, so readers
see all of a job's rows or none of them.

The outcome of a commit is knowable (DESIGN rule 16): the CAS that registers a batch write job's ledgers
also records the job id as committed, and an abort records it as aborted in a CAS of its own; whichever
lands first decides, and the other finds the job's outcome in the record. A commit whose reply was lost
reads the record back and finds its job there (committed_job returns None), so it is reported as done
and never registered twice; an abort that finds the job committed keeps its ledgers, and an abort that
lands first bumps the record's version, so a commit still in flight from before can no longer land.
Only the outcomes of the newest JOBS_KEPT jobs are kept, oldest dropped first: a commit and its
read-back or abort follow each other within one driver call, so a job's outcome is evicted only if
that many other jobs end on the same stream meanwhile, and the record stays small however long the
stream lives (rule 15). Streaming queries keep their last batch id in a znode each, beside the head
(metadata/query_commits.py).

These transforms see the stream's head (metadata/streams.py): its tail, which always holds the last
ledger; older ledgers are in pages they never need.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage

from connector.spark.errors import StreamOwnedError, UnsupportedStreamFormatError
from connector.spark.jobs import WriteJobEndedError
from connector.spark.schema import appendable_schema, decode_schema, encode_schema
from metadata.model import StreamLedger, StreamRecord

ARROW = "arrow"
COMMITTED = "committed"
ABORTED = "aborted"
JOBS_KEPT = 100  # batch write job outcomes a stream record keeps (see the module docstring)


@dataclasses.dataclass(frozen=True)
class TaskLedger(WriterCommitMessage):
    """What a write task hands the driver: the ledger it wrote (None if it had no rows)."""

    partition: int
    ledger_id: int | None
    rows: int
    entries: int


def new_stream(name: str) -> StreamRecord:
    return StreamRecord(name=name, format=ARROW)


def check_arrow_stream(record: StreamRecord) -> None:
    if record.format != ARROW:
        raise UnsupportedStreamFormatError(
            f"stream {record.name!r} holds {record.format} entries, not Arrow rows; Spark writes only to arrow "
            "streams: choose another stream name"
        )


def check_last_ledger_closed(record: StreamRecord) -> None:
    last = record.last_ledger
    if last is not None and last.last_offset is None:
        raise StreamOwnedError(
            f"stream {record.name!r} has an OPEN last ledger {last.ledger_id} with a live writer; "
            "stop that writer (or wait until it is gone and read the stream once to recover it), then write again"
        )


def committed(
    record: StreamRecord, tasks: Sequence[TaskLedger], schema: pa.Schema, overwrite: bool
) -> StreamRecord:
    """record with the task ledgers appended (or replacing every ledger, for overwrite). An overwrite
    continues from the stream's next offset, even with no rows: offsets only grow (rule 17), so a reader
    that passed an offset never sees it handed out again. Its first_offset moves there: the replaced
    ledgers (tail and pages) are no longer in the stream, and streams.drop_below deletes them."""
    check_arrow_stream(record)
    check_last_ledger_closed(record)
    if overwrite or not record.schema:
        recorded = schema
    else:
        recorded = appendable_schema(record.name, decode_schema(record.schema), schema)
    offset = record.next_offset
    added = []
    for task in sorted(tasks, key=lambda t: t.partition):
        if task.ledger_id is None or task.rows == 0:
            continue
        added.append(StreamLedger(task.ledger_id, offset, offset + task.rows - 1))
        offset += task.rows
    if overwrite:
        return record.replace(schema=encode_schema(recorded), tail=tuple(added), first_offset=record.next_offset)
    return record.replace(schema=encode_schema(recorded), tail=record.tail + tuple(added))


def committed_job(
    record: StreamRecord, job_id: str, tasks: Sequence[TaskLedger], schema: pa.Schema, overwrite: bool
) -> StreamRecord | None:
    """The commit of batch write job_id: committed() plus the job's outcome; None if the record holds the job
    committed already (the commit landed and its reply was lost, or the commit is run again)."""
    outcome = job_outcome(record, job_id)
    if outcome == COMMITTED:
        return None
    if outcome == ABORTED:
        raise WriteJobEndedError(
            f"write job {job_id} was aborted before its commit reached stream {record.name!r}: none of its rows "
            "were committed and its ledgers are deleted; run the write again"
        )
    return with_job(committed(record, tasks, schema, overwrite), job_id, COMMITTED)


def aborted_job(record: StreamRecord, job_id: str) -> StreamRecord | None:
    """The abort of job_id: the record with the job marked aborted, or None if the job has an outcome already."""
    if job_outcome(record, job_id) is not None:
        return None
    return with_job(record, job_id, ABORTED)


def job_outcome(record: StreamRecord, job_id: str) -> str | None:
    return dict(record.jobs).get(job_id)


def with_job(record: StreamRecord, job_id: str, outcome: str) -> StreamRecord:
    return record.replace(jobs=(record.jobs + ((job_id, outcome),))[-JOBS_KEPT:])


def sealed(record: StreamRecord, ledger_id: int, last_offset: int) -> StreamRecord:
    """record with its OPEN ledger ledger_id given the end it was recovered (closed) at."""
    ledgers = tuple(
        dataclasses.replace(s, last_offset=last_offset) if s.ledger_id == ledger_id and s.last_offset is None else s
        for s in record.tail
    )
    return record.replace(tail=ledgers)


def with_open_ledger(record: StreamRecord, ledger_id: int) -> StreamRecord:
    """record with a new OPEN ledger at its end, as a stream owner adds the ledger it writes (rule 14)."""
    check_last_ledger_closed(record)
    return record.replace(tail=record.tail + (StreamLedger(ledger_id, record.next_offset, None),))
