"""connector/spark/commit.py: one CAS registers a job's ledgers with contiguous row offsets and the job's outcome."""
import json

import pyarrow as pa
import pytest

from connector.spark.commit import (
    ABORTED, COMMITTED, JOBS_KEPT, TaskLedger, aborted_job, committed, committed_job, job_outcome,
    new_stream, sealed, with_open_ledger,
)
from connector.spark.errors import SchemaMismatchError, StreamOwnedError, UnsupportedStreamFormatError
from connector.spark.jobs import WriteJobEndedError
from connector.spark.schema import decode_schema
from metadata import serde
from metadata.model import StreamLedger, StreamRecord

SCHEMA = pa.schema([("a", pa.int64())])


def test_append_registers_ledgers_in_partition_order_with_row_offsets():
    tasks = [TaskLedger(1, 21, 5, 1), TaskLedger(0, 20, 3, 1), TaskLedger(2, None, 0, 0)]
    record = committed(new_stream("s"), tasks, SCHEMA, overwrite=False)
    assert record.tail == (StreamLedger(20, 0, 2), StreamLedger(21, 3, 7))
    assert decode_schema(record.schema).equals(SCHEMA)
    again = committed(record, [TaskLedger(0, 30, 10, 2)], SCHEMA, overwrite=False)
    assert again.tail[-1] == StreamLedger(30, 8, 17)


def test_overwrite_replaces_ledgers_and_schema_keeping_offsets_monotonic():
    record = committed(new_stream("s"), [TaskLedger(0, 20, 3, 1)], SCHEMA, overwrite=False)
    other = pa.schema([("b", pa.string())])
    replaced = committed(record, [TaskLedger(0, 40, 2, 1)], other, overwrite=True)
    assert replaced.tail == (StreamLedger(40, 3, 4),)
    assert decode_schema(replaced.schema).equals(other)


def test_an_overwrite_with_no_rows_keeps_the_next_offset_for_later_rows():
    """Issue 13 finding 4 (rule 17): offsets only grow, even through an empty overwrite."""
    record = committed(new_stream("s"), [TaskLedger(0, 20, 100, 1)], SCHEMA, overwrite=False)
    emptied = committed(record, [TaskLedger(0, None, 0, 0)], SCHEMA, overwrite=True)
    assert emptied.tail == () and emptied.next_offset == 100
    stored = serde.decode_stream(serde.encode_stream(emptied))
    assert stored.next_offset == 100
    later = committed(stored, [TaskLedger(0, 41, 5, 1)], SCHEMA, overwrite=False)
    assert later.tail == (StreamLedger(41, 100, 104),)


def test_incompatible_append_fails():
    record = committed(new_stream("s"), [TaskLedger(0, 20, 3, 1)], SCHEMA, overwrite=False)
    with pytest.raises(SchemaMismatchError):
        committed(record, [TaskLedger(0, 21, 1, 1)], pa.schema([("a", pa.string())]), overwrite=False)


def test_raw_stream_and_open_tail_are_refused():
    with pytest.raises(UnsupportedStreamFormatError, match="raw"):
        committed(StreamRecord("r", format="raw"), [], SCHEMA, overwrite=False)
    open_tail = with_open_ledger(new_stream("s"), 9)
    assert open_tail.tail == (StreamLedger(9, 0, None),)
    with pytest.raises(StreamOwnedError, match="OPEN last ledger 9"):
        committed(open_tail, [TaskLedger(0, 20, 3, 1)], SCHEMA, overwrite=False)
    closed = sealed(open_tail, 9, 41)
    assert committed(closed, [TaskLedger(0, 20, 3, 1)], SCHEMA, overwrite=False).tail[-1] == StreamLedger(20, 42, 44)


def test_commit_records_the_job_and_finds_it_on_read_back():
    tasks = [TaskLedger(0, 20, 3, 1)]
    record = committed_job(new_stream("s"), "job-1", tasks, SCHEMA, overwrite=False)
    assert record.tail == (StreamLedger(20, 0, 2),)
    assert job_outcome(record, "job-1") == COMMITTED
    # Rule 16: a commit whose reply was lost, or a retry of it, finds its job and changes nothing.
    assert committed_job(record, "job-1", tasks, SCHEMA, overwrite=False) is None
    assert committed_job(record, "job-1", tasks, SCHEMA, overwrite=True) is None


def test_abort_and_commit_of_a_job_exclude_each_other():
    aborted = aborted_job(new_stream("s"), "job-1")
    assert job_outcome(aborted, "job-1") == ABORTED and aborted.tail == ()
    assert aborted_job(aborted, "job-1") is None
    with pytest.raises(WriteJobEndedError, match="job-1 was aborted before its commit reached stream 's'"):
        committed_job(aborted, "job-1", [TaskLedger(0, 20, 3, 1)], SCHEMA, overwrite=False)
    done = committed_job(new_stream("s"), "job-2", [TaskLedger(0, 21, 3, 1)], SCHEMA, overwrite=False)
    assert aborted_job(done, "job-2") is None  # the commit landed first: the abort keeps it


def test_job_outcomes_are_bounded_oldest_dropped_first():
    record = new_stream("s")
    for n in range(JOBS_KEPT + 5):
        record = committed_job(record, f"job-{n}", [], SCHEMA, overwrite=False)
    assert len(record.jobs) == JOBS_KEPT
    assert record.jobs[0] == ("job-5", COMMITTED) and record.jobs[-1] == (f"job-{JOBS_KEPT + 4}", COMMITTED)
    assert job_outcome(record, "job-4") is None


def test_commit_records_survive_encoding_and_old_records_have_none():
    record = aborted_job(committed_job(new_stream("s"), "a", [TaskLedger(0, 20, 3, 1)], SCHEMA, False), "b")
    assert serde.decode_stream(serde.encode_stream(record)) == record
    old = json.loads(serde.encode_stream(new_stream("s")))
    del old["jobs"]
    assert serde.decode_stream(json.dumps(old).encode()).jobs == ()

