"""The Spark connector against a locked-down cluster: nodes with mutual TLS and a token, metadata behind
ZooKeeper ACLs. Every setting travels as a data source option, so driver and executors open their clients
with it (clients without them are refused: test_tls.py, test_token.py, test_zookeeper_acl.py)."""
from __future__ import annotations

import os
import sys

import pytest

from connector.spark import LedgerDataSource

SECRET = "spark-zk-s3cret"


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    session = (SparkSession.builder.master("local[2]").appName("ledger-security-tests")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
    session.dataSource.register(LedgerDataSource)
    # Not stopped here: getOrCreate hands the same session to later test modules of this run.
    return session


@pytest.mark.root_credentials(f"ledger:{SECRET}")
def test_spark_writes_and_reads_over_tls_with_token_and_zookeeper_acls(spark, pki, start_node, metadata_uri,
                                                                         tmp_path, monkeypatch):
    token = tmp_path / "token"
    token.write_text("spark-token")
    monkeypatch.setenv("LEDGER_ZK_AUTH", f"ledger:{SECRET}")  # the nodes' credentials
    for _ in range(3):
        start_node(None, *pki.node_args(), "--auth-token-file", str(token))
    monkeypatch.delenv("LEDGER_ZK_AUTH")
    tls = pki.client_tls()
    options = {"metadata": metadata_uri.replace("zk://", f"zk://ledger:{SECRET}@", 1), "tlsCa": tls.ca,
               "tlsCert": tls.cert, "tlsKey": tls.key, "authTokenFile": str(token)}

    df = spark.range(0, 500, numPartitions=2).selectExpr("id", "concat('row ', id) AS text")
    df.write.format("ledger").options(**options).mode("append").save("secured")
    back = spark.read.format("ledger").options(**options).load("secured")
    assert sorted((r.id, r.text) for r in back.collect()) == [(i, f"row {i}") for i in range(500)]
