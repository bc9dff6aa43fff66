"""The metadata view (option("view", "ledgers")): one row per ledger, for exploring a cluster in a notebook."""
from __future__ import annotations

import datetime
from typing import Iterator

from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import (
    ArrayType, IntegerType, LongType, MapType, StringType, StructField, StructType, TimestampType,
)

from connector.spark.options import LedgerOptions
from metadata.errors import NoSuchLedgerError, NoSuchStreamError, OffsetsGoneError
from metadata.model import LedgerMetadata, StreamLedger
from metadata.store import MetadataStore
from metadata.streams import iter_ledgers, list_streams, read_stream

VIEW_SCHEMA = StructType([
    StructField("ledger_id", LongType()), StructField("stream", StringType()), StructField("state", StringType()),
    StructField("ensemble_size", IntegerType()), StructField("write_quorum", IntegerType()),
    StructField("ack_quorum", IntegerType()), StructField("last_entry_id", LongType()),
    StructField("length", LongType()), StructField("first_offset", LongType()), StructField("last_offset", LongType()),
    StructField("fragments", ArrayType(StructType([
        StructField("first_entry_id", LongType()), StructField("ensemble", ArrayType(StringType()))]))),
    StructField("custom", MapType(StringType(), StringType())), StructField("writer_id", StringType()),
    StructField("created_at", TimestampType()),
])


class LedgerViewReader(DataSourceReader):
    """All ledgers, or the ledgers of the stream given as path; one partition (metadata is small)."""

    def __init__(self, options: LedgerOptions):
        self.options = options

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        with MetadataStore(self.options.metadata) as store:
            names = [self.options.stream] if self.options.stream else list_streams(store)
            membership: dict[int, tuple[str, StreamLedger]] = {}
            for name in names:
                try:
                    for ledger in iter_ledgers(store, read_stream(store, name).value):
                        membership[ledger.ledger_id] = (name, ledger)
                except (NoSuchStreamError, OffsetsGoneError):
                    if self.options.stream:
                        raise
                    continue   # deleted, or cut, while the cluster's streams were listed: not one to show
            ledger_ids = sorted(membership) if self.options.stream else store.list_ledgers()
            for ledger_id in ledger_ids:
                try:
                    meta = store.read_ledger(ledger_id).value
                except NoSuchLedgerError:
                    continue
                yield view_row(meta, *membership.get(ledger_id, (None, None)))


def view_row(meta: LedgerMetadata, stream: str | None, ledger: StreamLedger | None) -> tuple:
    return (
        meta.ledger_id,
        stream if stream is not None else meta.custom.get("stream"),
        meta.state.value,
        meta.ensemble_size,
        meta.write_quorum,
        meta.ack_quorum,
        meta.last_entry_id,
        meta.length,
        ledger.first_offset if ledger else None,
        ledger.last_offset if ledger else None,
        [(f.first_entry_id, list(f.ensemble)) for f in meta.fragments],
        meta.custom,
        meta.writer_id,
        datetime.datetime.fromtimestamp(meta.created_at, tz=datetime.timezone.utc),
    )
