"""A Spark application that never registers the data source: `python -m tests.spark.unregistered_session URI
STREAM` writes 100 rows with format("ledger"), reads them back and prints a JSON summary."""
import json
import sys

from pyspark.sql import SparkSession

from tests.spark.conftest import spark_conf


def main(uri: str, stream: str) -> None:
    spark = spark_conf(SparkSession.builder.appName("unregistered-session"), "local[1]").getOrCreate()
    spark.range(0, 100).write.format("ledger").option("metadata", uri).mode("append").save(stream)
    df = spark.read.format("ledger").option("metadata", uri).load(stream)
    print(json.dumps({"count": df.count(), "sum_id": df.agg({"id": "sum"}).collect()[0][0]}))
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:3])
