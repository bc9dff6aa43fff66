"""A stand-in for Spark's TaskContext: the calls a write task makes (partition, attempt, the micro-batch id
property), so that the executor side of a write (write_task_ledger, LedgerWriter.write) can run without a
SparkSession, as the history benchmark and the tests that script task attempts run it."""
from __future__ import annotations

import dataclasses

from connector.spark.stream_write import BATCH_PROPERTY


@dataclasses.dataclass(frozen=True)
class StandInTask:
    partition: int
    attempt: int = 0
    batch: int = 0

    def partitionId(self) -> int:
        return self.partition

    def attemptNumber(self) -> int:
        return self.attempt

    def taskAttemptId(self) -> int:
        return self.partition * 100 + self.attempt

    def getLocalProperty(self, key: str) -> str | None:
        return str(self.batch) if key == BATCH_PROPERTY else None
