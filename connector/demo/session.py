"""A local SparkSession with the ledger format registered, for the demo, the stream benchmark and the soak's
Spark actor.

Spark binds to the machine's first non-loopback address unless told otherwise; everything here
stays on 127.0.0.1. Its Python workers must run this interpreter (pyarrow, the connector).
"""
from __future__ import annotations

import os
import sys


def local_session(app_name: str, master: str = "local[2]", **conf: str):
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from connector.spark.datasource import LedgerDataSource

    builder = (
        SparkSession.builder.master(master).appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(LedgerDataSource)
    return spark
