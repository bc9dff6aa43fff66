"""The Spark application of test_multi_host_layout, submitted with spark-submit as the README shows.

    spark-submit --master local-cluster[2,1,1024] ... tests/integration/multi_host_job.py URI STREAM ROWS PASSWORD

Writes ROWS sample rows to STREAM in 4 tasks with explicit quorums and a password, reads them back, and
prints one line `RESULT {json}` with what it saw, including how many executors (separate JVMs) served it.
"""
import json
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from connector.demo.sample import sample_dataframe
from connector.spark import LedgerDataSource


def main(uri: str, stream: str, rows: int, password: str) -> None:
    spark = SparkSession.builder.appName("multi-host-layout").getOrCreate()
    spark.dataSource.register(LedgerDataSource)
    options = {"metadata": uri, "ensembleSize": "3", "writeQuorum": "2", "ackQuorum": "2", "password": password,
               "entryBytes": "16384"}
    sample_dataframe(spark, rows, partitions=4).write.format("ledger").options(**options).mode("append").save(stream)
    back = spark.read.format("ledger").options(**options).option("includeMetadata", "true").load(stream)
    summary = back.agg(F.count("*").alias("rows"), F.countDistinct("id").alias("ids"), F.sum("id").alias("id_sum"),
                       F.countDistinct("_ledger_id").alias("ledgers")).collect()[0]
    executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1  # minus the driver
    print("RESULT " + json.dumps({**summary.asDict(), "executors": executors,
                                  "master": spark.sparkContext.master}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
