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

from connector.demo.sample import sample_batch
from connector.spark.schema import arrow_schema_of

SCHEMA = "id long, ts timestamp, key string, value binary"
POOL_BATCHES = 64   # distinct batches yielded in turn: more memory than the CPU caches hold, like a real read
_POOL: dict[int, list[pa.RecordBatch]] = {}


class CeilingReader(DataSourceReader):
    def __init__(self, schema: pa.Schema, rows: int, partitions: int, batch_bytes: int):
        self.schema, self.rows, self.partitions_count, self.batch_bytes = schema, rows, partitions, batch_bytes

    def partitions(self) -> list[InputPartition]:
        share, extra = divmod(self.rows, self.partitions_count)
        return [InputPartition(share + (i < extra)) for i in range(self.partitions_count)]

    def read(self, partition: InputPartition):
        batches = self._batches()
        left, i = partition.value, 0
        while left > 0:
            batch = batches[i % len(batches)]
            piece = batch if left >= batch.num_rows else batch.slice(0, left)
            left -= piece.num_rows
            i += 1
            yield piece

    def _batches(self) -> list[pa.RecordBatch]:
        """Distinct batches of about batch_bytes, built once per Python worker (a run that reuses the worker
        measures only the yielding)."""
        if self.batch_bytes not in _POOL:
            probe = sample_batch(0, 1000, self.schema)
            per_batch = max(1, self.batch_bytes * probe.num_rows // probe.nbytes)
            _POOL[self.batch_bytes] = [sample_batch(i * per_batch, per_batch, self.schema)
                                       for i in range(POOL_BATCHES)]
        return _POOL[self.batch_bytes]


class CeilingWriter(DataSourceArrowWriter):
    """Takes every row it is given and keeps none."""

    def write(self, iterator) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages) -> None:
        pass

    def abort(self, messages) -> None:
        pass


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
        return CeilingReader(arrow_schema_of(schema), int(self.options["rows"]), int(self.options["partitions"]),
                             int(self.options["batchbytes"]))
