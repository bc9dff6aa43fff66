"""A Spark driver of its own, appending to a stream, for the janitor tests (tests/spark/test_janitor.py).

`python -m tests.spark.janitor_job URI STREAM ROWS RELEASE` appends ids 0..ROWS-1 (with a 64-character hash
each) in PARTITIONS partitions under local[2]. Partitions below FAST_PARTITIONS write all their rows; the
others write their first HOLD_AT_BATCH batches and then hold the rest back until the file RELEASE exists. So once the
job's registry holds PARTITIONS entries, the fast partitions' ledgers are closed and the held ones are OPEN
with rows in them, and the driver stands in the middle of its append: the test interrupts it there (SIGINT,
SIGKILL) or pauses it (SIGSTOP) and releases it. Prints `committed ROWS` once the append returned.
"""
import os
import sys

from pyspark import TaskContext
from pyspark.sql import SparkSession

from connector.spark import LedgerDataSource
from tests.harness.poll import poll_until
from tests.spark.conftest import spark_conf
from tests.spark.helpers import REPO

PARTITIONS = 4
FAST_PARTITIONS = 2
BATCH = 1000  # rows per Arrow batch handed to the writer
HOLD_AT_BATCH = 10  # Spark passes all but the last batch or two on to the writer
HOLD_SECONDS = 600


def hold_slow_partitions(release: str):
    def run(batches):
        slow = TaskContext.get().partitionId() >= FAST_PARTITIONS
        for index, batch in enumerate(batches):
            if slow and index == HOLD_AT_BATCH:
                poll_until(lambda: os.path.exists(release), HOLD_SECONDS, interval=0.2, what="the release file")
            yield batch
    return run


def main(uri: str, stream: str, rows: str, release: str) -> None:
    spark = (
        spark_conf(SparkSession.builder.appName("janitor-driver"))
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(BATCH))
        .config("spark.executorEnv.PYTHONPATH", str(REPO))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(LedgerDataSource)
    df = spark.range(0, int(rows), numPartitions=PARTITIONS).selectExpr("id", "sha2(cast(id as string), 256) AS h")
    df = df.mapInArrow(hold_slow_partitions(release), df.schema)
    df.write.format("ledger").mode("append").option("metadata", uri).option("entryBytes", "8192").save(stream)
    print(f"committed {rows}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
