"""A streaming query in its own driver process: JSON files -> the ledger sink, Trigger.AvailableNow.

python -m tests.spark.stream_sink_job URI STREAM INPUT_DIR CHECKPOINT [HOLD_FILE]

With HOLD_FILE, the task of partition 1 waits (polling, with a deadline) until that file exists, so a
test can act while partition 0 has written its ledger and the batch is not committed yet.
"""
import os
import pathlib
import sys

from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from connector.spark import LedgerDataSource
from tests.harness.poll import poll_until
from tests.spark.conftest import spark_conf


def hold(value, hold_file):
    if hold_file and TaskContext.get().partitionId() == 1:
        poll_until(lambda: os.path.exists(hold_file), 300, what=f"the test to create {hold_file}")
    return value


def start_query(spark, uri, stream, input_dir, checkpoint, hold_file=""):
    """The query under test; the same plan in every run, so a restart continues its checkpoint."""
    held = F.udf(lambda v: hold(v, hold_file), "string")
    source = spark.readStream.schema("id long, value string").json(str(input_dir)).repartition(2, "id")
    return (
        source.select("id", held("value").alias("value"))
        .writeStream.format("ledger").option("metadata", uri).option("ensembleSize", "3")
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start(stream)
    )


def main(uri, stream, input_dir, checkpoint, hold_file=""):
    spark = spark_conf(SparkSession.builder.appName("stream-sink-job")).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(LedgerDataSource)
    query = start_query(spark, uri, stream, input_dir, checkpoint, hold_file)
    print("started", flush=True)
    query.awaitTermination()
    print("done", flush=True)
    spark.stop()


if __name__ == "__main__":
    pathlib.Path(sys.argv[3]).mkdir(parents=True, exist_ok=True)
    main(*sys.argv[1:])
