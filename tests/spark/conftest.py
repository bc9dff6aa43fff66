"""Spark fixtures: one SparkSession (local[2]) and one 3-node cluster for the whole Spark test session.

Tests share the cluster and tell their data apart by stream name (the `stream` fixture); tests that
kill nodes start their own cluster with the `cluster` fixture of tests/conftest.py.
"""
from __future__ import annotations

import os
import re
import sys

import pytest

from connector.spark import LedgerDataSource
from metadata.store import initialise_root
from tests.harness.node_process import NodeProcess

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def spark_conf(builder, master: str = "local[2]"):
    return (
        builder.master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .config("spark.driver.memory", "1g")
    )


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    session = spark_conf(SparkSession.builder.appName("ledger-spark-tests")).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(LedgerDataSource)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def shared_uri(zookeeper, tmp_path_factory) -> str:
    """The metadata URI of a 3-node cluster that lives as long as the test session."""
    uri = zookeeper.uri(f"/spark-{os.getpid()}/ledgers")
    initialise_root(uri)
    root = tmp_path_factory.mktemp("spark-cluster")
    nodes = [NodeProcess(uri, root / f"node-{i}", f"node-{i}").start() for i in (1, 2, 3)]
    yield uri
    for node in nodes:
        node.kill()


@pytest.fixture
def stream(request) -> str:
    """A stream name of this test's own."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)[:150]
