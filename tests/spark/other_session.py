"""Another Spark application reads a stream: `python -m tests.spark.other_session URI STREAM` prints a JSON summary."""
import json
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from connector.spark import LedgerDataSource
from tests.spark.conftest import spark_conf


def main(uri: str, stream: str) -> None:
    spark = spark_conf(SparkSession.builder.appName("other-session"), "local[1]").getOrCreate()
    spark.dataSource.register(LedgerDataSource)
    df = spark.read.format("ledger").option("metadata", uri).load(stream)
    row = df.agg(F.count("*"), F.sum("id"), F.sum("twice")).collect()[0]
    print(json.dumps({"count": row[0], "sum_id": row[1], "sum_twice": row[2]}))
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:3])
