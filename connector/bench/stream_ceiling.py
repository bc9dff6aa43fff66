"""The fastest a Python streaming source can hand a new row to a streaming query on this machine.

`ledger bench stream` tails this source beside the ledger stream, with the same trigger and the same
foreachBatch sink: the benchmark appends a fixed-size record to a local file (no fsync, no replication,
no ZooKeeper) where it would append an entry to the stream, and the source's latestOffset is the
file's record count. What remains of a row's latency here is Spark planning and running a micro-batch
through Python workers; the difference to the ledger's latency is what the ledger source costs.
"""
from __future__ import annotations

import os
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

RECORD_BYTES = 16   # one record per offset: the offset, zero-padded, and a newline
SCHEMA = "_offset long"


def append_record(path: str, offset: int) -> None:
    """Append offset's record (the benchmark's side: where it would append to the stream)."""
    with open(path, "ab") as out:
        out.write(f"{offset:015d}\n".encode())


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
        yield pa.RecordBatch.from_arrays([pa.array(range(partition.start, partition.end), pa.int64())],
                                         names=["_offset"])

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

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema) -> CeilingStreamReader:
        return CeilingStreamReader(self.options["path"])
