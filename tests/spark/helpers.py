"""Helpers of the Spark tests: read and write a stream with options, list a stream's ledgers."""
from __future__ import annotations

import pathlib

from connector.client import LedgerClient
from connector.spark.recovery import STREAM_TAG

REPO = pathlib.Path(__file__).resolve().parents[2]


def stream_ledgers(uri: str, stream: str) -> list[int]:
    """Every ledger tagged with the stream, committed or not."""
    with LedgerClient(uri) as lc:
        return [i for i in lc.list_ledgers() if lc.ledger_metadata(i).custom.get(STREAM_TAG) == stream]


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
