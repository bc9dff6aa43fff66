"""connector/spark/commit.py: one CAS registers a job's ledgers with contiguous row offsets."""
import pyarrow as pa
import pytest

from connector.spark.commit import TaskLedger, committed, new_stream, sealed, with_open_ledger
from connector.spark.errors import SchemaMismatchError, StreamOwnedError, UnsupportedStreamFormatError
from connector.spark.schema import decode_schema
from metadata.model import StreamLedger, StreamRecord

SCHEMA = pa.schema([("a", pa.int64())])


def test_append_registers_ledgers_in_partition_order_with_row_offsets():
    tasks = [TaskLedger(1, 21, 5, 1), TaskLedger(0, 20, 3, 1), TaskLedger(2, None, 0, 0)]
    record = committed(new_stream("s"), tasks, SCHEMA, overwrite=False)
    assert record.ledgers == (StreamLedger(20, 0, 2), StreamLedger(21, 3, 7))
    assert decode_schema(record.schema).equals(SCHEMA)
    again = committed(record, [TaskLedger(0, 30, 10, 2)], SCHEMA, overwrite=False)
    assert again.ledgers[-1] == StreamLedger(30, 8, 17)


def test_overwrite_replaces_ledgers_and_schema_keeping_offsets_monotonic():
    record = committed(new_stream("s"), [TaskLedger(0, 20, 3, 1)], SCHEMA, overwrite=False)
    other = pa.schema([("b", pa.string())])
    replaced = committed(record, [TaskLedger(0, 40, 2, 1)], other, overwrite=True)
    assert replaced.ledgers == (StreamLedger(40, 3, 4),)
    assert decode_schema(replaced.schema).equals(other)


def test_incompatible_append_fails():
    record = committed(new_stream("s"), [TaskLedger(0, 20, 3, 1)], SCHEMA, overwrite=False)
    with pytest.raises(SchemaMismatchError):
        committed(record, [TaskLedger(0, 21, 1, 1)], pa.schema([("a", pa.string())]), overwrite=False)


def test_raw_stream_and_open_tail_are_refused():
    with pytest.raises(UnsupportedStreamFormatError, match="raw"):
        committed(StreamRecord("r", format="raw"), [], SCHEMA, overwrite=False)
    open_tail = with_open_ledger(new_stream("s"), 9)
    assert open_tail.ledgers == (StreamLedger(9, 0, None),)
    with pytest.raises(StreamOwnedError, match="OPEN last ledger 9"):
        committed(open_tail, [TaskLedger(0, 20, 3, 1)], SCHEMA, overwrite=False)
    closed = sealed(open_tail, 9, 41)
    assert committed(closed, [TaskLedger(0, 20, 3, 1)], SCHEMA, overwrite=False).ledgers[-1] == StreamLedger(20, 42, 44)
