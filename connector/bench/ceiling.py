"""The fastest a Python Data Source can be read or written on this machine.

`ledger bench spark` reads this source beside the ledger stream: the same row count, schema, partition
count and batch size (one batch per entry of entryBytes), yielded from memory with nothing fetched or
decoded, so the difference to it is what reading from the storage nodes costs, and the rest of the gap
to parquet is Spark moving every row from a Python worker into the JVM (parquet is read by the JVM
alone, and answers a count from its footers). Writing the DataFrame to it hands every row to an Arrow
writer that only counts them: the cost of moving the rows from the JVM into Python workers.
"""
from __future__ import annotations

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, DataSourceReader, InputPartition, WriterCommitMessage

from connector.spark.sample import sample_batch

SCHEMA = "id long, ts timestamp, key string, value binary"


class CeilingPartition(InputPartition):
    def __init__(self, rows: int, batch_bytes: int):
        super().__init__(rows)
        self.rows = rows
        self.batch_bytes = batch_bytes


class CeilingReader(DataSourceReader):
    def __init__(self, rows: int, partitions: int, batch_bytes: int):
        self.rows, self.partitions_count, self.batch_bytes = rows, partitions, batch_bytes

    def partitions(self) -> list[CeilingPartition]:
        share, extra = divmod(self.rows, self.partitions_count)
        return [CeilingPartition(share + (i < extra), self.batch_bytes) for i in range(self.partitions_count)]

    def read(self, partition: CeilingPartition):
        batches = _batches(partition.batch_bytes)
        left, i = partition.rows, 0
        while left > 0:
            batch = batches[i % len(batches)]
            piece = batch if left >= batch.num_rows else batch.slice(0, left)
            left -= piece.num_rows
            i += 1
            yield piece


_POOL: dict[int, list[pa.RecordBatch]] = {}
POOL_BATCHES = 64   # distinct batches yielded in turn: more memory than the CPU caches hold, like a real read


def _batches(batch_bytes: int) -> list[pa.RecordBatch]:
    """Distinct batches of about batch_bytes, built once per Python worker (a run that reuses the worker
    measures only the yielding)."""
    if batch_bytes not in _POOL:
        schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")), ("key", pa.string()),
                            ("value", pa.binary())])
        probe = sample_batch(0, 1000, schema)
        per_batch = max(1, batch_bytes * probe.num_rows // probe.nbytes)
        _POOL[batch_bytes] = [sample_batch(i * per_batch, per_batch, schema) for i in range(POOL_BATCHES)]
    return _POOL[batch_bytes]


class CeilingWriter(DataSourceArrowWriter):
    def write(self, iterator) -> WriterCommitMessage:
        rows = sum(batch.num_rows for batch in iterator)
        return CountedRows(rows)

    def commit(self, messages) -> None:
        pass

    def abort(self, messages) -> None:
        pass


class CountedRows(WriterCommitMessage):
    def __init__(self, rows: int):
        self.rows = rows


class CeilingDataSource(DataSource):
    """Options for reading: rows, partitions, batchBytes. Writing takes any rows of the schema."""

    @classmethod
    def name(cls) -> str:
        return "ledger_bench_ceiling"

    def schema(self) -> str:
        return SCHEMA

    def writer(self, schema, overwrite: bool) -> CeilingWriter:
        return CeilingWriter()

    def reader(self, schema) -> CeilingReader:
        return CeilingReader(int(self.options["rows"]), int(self.options["partitions"]),
                             int(self.options["batchbytes"]))
