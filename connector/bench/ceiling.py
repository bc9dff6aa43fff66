"""The fastest a Python Data Source can be read on this machine: Arrow batches yielded from memory.

`ledger bench spark` reads this source beside the ledger stream: the same row count, schema, partition
count and batch size (one batch per entry of entryBytes), with nothing fetched or decoded, so the
difference to it is what reading from the storage nodes costs, and the rest of the gap to parquet is
Spark moving every row from a Python worker into the JVM (parquet is read by the JVM alone, and
answers a count from its footers).
"""
from __future__ import annotations

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

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
        schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")), ("key", pa.string()),
                            ("value", pa.binary())])
        probe = sample_batch(0, 1000, schema)
        per_batch = max(1, partition.batch_bytes * probe.num_rows // probe.nbytes)
        batch = sample_batch(0, min(per_batch, max(1, partition.rows)), schema)
        left = partition.rows
        while left > 0:
            piece = batch if left >= batch.num_rows else batch.slice(0, left)
            left -= piece.num_rows
            yield piece


class CeilingDataSource(DataSource):
    """Options: rows, partitions, batchBytes."""

    @classmethod
    def name(cls) -> str:
        return "ledger_bench_ceiling"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema) -> CeilingReader:
        return CeilingReader(int(self.options["rows"]), int(self.options["partitions"]),
                             int(self.options["batchbytes"]))
