"""The fastest a Python streaming source can hand a new row to a streaming query on this machine.

`ledger bench stream` tails this source beside the ledger stream, with the same trigger and the same
foreachBatch sink: the benchmark appends a fixed-size record to a local file (no fsync, no replication,
no ZooKeeper) where it would append an entry to the stream, and the source's latestOffset is the
file's record count. Its rows have the columns of the ledger query's rows (a raw stream read with
includeMetadata: ledger_id, entry_id, payload, _offset, _timestamp), read from the records, so that
Spark moves the same row through both. What remains of a row's latency here is Spark planning and
running a micro-batch through Python workers; the difference to the ledger's latency is what the ledger
source costs.
"""
from __future__ import annotations

import os
import time
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from connector.spark.schema import arrow_schema_of, raw_read_schema

# A record per offset: its payload's length (2 digits), the payload padded to PAYLOAD_BYTES, its append time in ms
# (TIME_DIGITS digits) and a newline.
PAYLOAD_BYTES, TIME_DIGITS = 16, 15
RECORD_BYTES = 2 + PAYLOAD_BYTES + TIME_DIGITS + 1
SCHEMA = raw_read_schema(include_metadata=True)
ARROW_SCHEMA = arrow_schema_of(SCHEMA)


def append_record(path: str, payload: bytes) -> None:
    """Append a record (the benchmark's side: where it would append an entry to the stream); its offset is the
    number of records before it."""
    if len(payload) > PAYLOAD_BYTES:
        raise ValueError(f"a ceiling record holds payloads of up to {PAYLOAD_BYTES} bytes, not {len(payload)}")
    record = b"%02d%s%0*d\n" % (len(payload), payload.ljust(PAYLOAD_BYTES), TIME_DIGITS, int(time.time() * 1000))
    with open(path, "ab") as out:
        out.write(record)


class CeilingStreamPartition(InputPartition):
    def __init__(self, start: int, end: int):
        super().__init__((start, end))
        self.start, self.end = start, end


class CeilingStreamReader(DataSourceStreamReader):
    def __init__(self, path: str):
        self.path = path

    def initialOffset(self) -> dict:
        return {"offset": self._records()}

    def latestOffset(self) -> dict:
        return {"offset": self._records()}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [CeilingStreamPartition(start["offset"], end["offset"])]

    def read(self, partition: CeilingStreamPartition) -> Iterator[pa.RecordBatch]:
        if partition.end <= partition.start:
            return   # no offsets: nothing to read (the file may not exist yet)
        with open(self.path, "rb") as records:
            records.seek(partition.start * RECORD_BYTES)
            data = records.read((partition.end - partition.start) * RECORD_BYTES)
        rows = [data[at:at + RECORD_BYTES] for at in range(0, len(data), RECORD_BYTES)]
        offsets = pa.array(range(partition.start, partition.start + len(rows)), pa.int64())
        yield pa.RecordBatch.from_arrays([
            pa.array([0] * len(rows), pa.int64()),
            offsets,
            pa.array([row[2:2 + int(row[:2])] for row in rows], pa.binary()),
            offsets,
            pa.array([int(row[2 + PAYLOAD_BYTES:-1]) * 1000 for row in rows], pa.timestamp("us", tz="UTC")),
        ], schema=ARROW_SCHEMA)

    def commit(self, end: dict) -> None:
        pass

    def _records(self) -> int:
        try:
            return os.stat(self.path).st_size // RECORD_BYTES
        except FileNotFoundError:
            return 0


class CeilingStreamDataSource(DataSource):
    """Option path: the file the benchmark appends records to."""

    @classmethod
    def name(cls) -> str:
        return "ledger_bench_stream_ceiling"

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema) -> CeilingStreamReader:
        return CeilingStreamReader(self.options["path"])
