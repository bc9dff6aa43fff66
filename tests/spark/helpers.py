"""Helpers of the Spark tests: read and write a stream with options, list a stream's ledgers."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from connector.client import LedgerClient
from connector.spark.read import pruning_is_scan_scoped
from connector.spark.recovery import STREAM_TAG

REPO = pathlib.Path(__file__).resolve().parents[2]


def stream_ledgers(uri: str, stream: str) -> list[int]:
    """Every ledger tagged with the stream, committed or not."""
    with LedgerClient(uri) as lc:
        return [i for i in lc.list_ledgers() if lc.ledger_metadata(i).custom.get(STREAM_TAG) == stream]


def planned(pruned: int, unpruned: int) -> int:
    """The partitions a read filtered on metadata columns plans: pruned where this Spark keeps a pushdown's
    plan to its own scan (connector.spark.read.pruning_is_scan_scoped), every one otherwise."""
    return pruned if pruning_is_scan_scoped() else unpruned


def read(spark, uri: str, stream: str | None, **options):
    reader = spark.read.format("ledger").option("metadata", uri)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load(stream) if stream else reader.load()


def write(df, uri: str, stream: str, mode: str = "append", **options):
    writer = df.write.format("ledger").mode(mode).option("metadata", uri)
    for key, value in options.items():
        writer = writer.option(key, str(value))
    writer.save(stream)


def run_application(module: str, *args: str, log: pathlib.Path, timeout: float) -> str:
    """Run `python -m module args` as a Spark application of its own (not attached to this test's JVM);
    returns its standard output, or fails with the tail of its log."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY_")}
    env["PYTHONPATH"] = str(REPO)
    with open(log, "w") as err:
        process = subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                                   stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            out, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise AssertionError(f"{module} did not finish within {timeout}s; log {log}: {log.read_text()[-3000:]}")
    assert process.returncode == 0, f"{module} failed; log {log}: {log.read_text()[-3000:]}"
    return out
