"""Stream record transforms for committing Spark writes: pure functions fed to update_stream's CAS loop.

Offsets of an arrow stream count rows: a ledger holding n rows registered after offset k covers
k+1..k+n. A commit registers every task ledger of a job in partition order in one CAS, so readers
see all of a job's rows or none of them.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage

from connector.spark.errors import StreamOwnedError, UnsupportedStreamFormatError
from connector.spark.schema import appendable_schema, decode_schema, encode_schema
from metadata.model import StreamLedger, StreamRecord

ARROW = "arrow"


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
    if record.ledgers and record.ledgers[-1].last_offset is None:
        raise StreamOwnedError(
            f"stream {record.name!r} has an OPEN last ledger {record.ledgers[-1].ledger_id} with a live writer; "
            "stop that writer (or wait until it is gone and read the stream once to recover it), then write again"
        )


def committed(
    record: StreamRecord, tasks: Sequence[TaskLedger], schema: pa.Schema, overwrite: bool
) -> StreamRecord:
    """record with the task ledgers appended (or replacing every ledger, for overwrite)."""
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
    kept = () if overwrite else record.ledgers
    return record.replace(schema=encode_schema(recorded), ledgers=kept + tuple(added))


def sealed(record: StreamRecord, ledger_id: int, last_offset: int) -> StreamRecord:
    """record with its OPEN ledger ledger_id given the end it was recovered (closed) at."""
    ledgers = tuple(
        dataclasses.replace(s, last_offset=last_offset) if s.ledger_id == ledger_id and s.last_offset is None else s
        for s in record.ledgers
    )
    return record.replace(ledgers=ledgers)


def with_open_ledger(record: StreamRecord, ledger_id: int) -> StreamRecord:
    """record with a new OPEN ledger at its end, as a stream owner adds the ledger it writes (rule 14)."""
    check_last_ledger_closed(record)
    return record.replace(ledgers=record.ledgers + (StreamLedger(ledger_id, record.next_offset, None),))
