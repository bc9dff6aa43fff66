"""LedgerDataSource: the `ledger` format for spark.read / df.write.

    spark.dataSource.register(LedgerDataSource)
    spark.read.format("ledger").option("metadata", uri).load("events")
    df.write.format("ledger").mode("append").save("events")
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

if TYPE_CHECKING:
    from connector.spark.options import LedgerOptions
    from metadata.model import StreamRecord

# Spark runs each step of a query in a Python process of its own: finding the source, its schema, planning a
# read, preparing and committing a write, each task. Every such process imports this module, so it imports
# only what Spark needs to find the source; each method imports what its own step needs (the storage client,
# Arrow, ZooKeeper), and a step never pays for another's.


class LedgerDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "ledger"

    def _options(self) -> LedgerOptions:
        from connector.spark.options import LedgerOptions
        return LedgerOptions.parse(self.options)

    def schema(self) -> StructType:
        from connector.spark.schema import raw_read_schema
        from connector.spark.stream_options import StreamOptions
        from connector.spark.view import VIEW_SCHEMA

        # Spark asks batch and streaming reads alike: accept the streaming options here; reader() and
        # streamReader() validate strictly for their own kind of read.
        opts, _ = StreamOptions.parse(self.options)
        opts.check_readable()
        if opts.view:
            return VIEW_SCHEMA
        if opts.ledgers:
            return raw_read_schema(opts.include_metadata)
        return read_schema(_stream(opts), opts.include_metadata)

    def reader(self, schema: StructType) -> DataSourceReader:
        from connector.spark.commit import ARROW
        from connector.spark.read import ledger_reader
        from connector.spark.view import LedgerViewReader

        opts = self._options()
        opts.check_readable()
        if opts.view:
            return LedgerViewReader(opts)
        raw = bool(opts.ledgers) or _stream(opts).format != ARROW
        return ledger_reader(opts, schema, raw)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from connector.spark.commit import ARROW
        from connector.spark.errors import InvalidOptionError
        from connector.spark.stream_options import StreamOptions
        from connector.spark.stream_read import LedgerStreamReader, RefusedStreamReader

        try:
            opts, stream_opts = StreamOptions.parse(self.options)
            if not opts.stream or opts.ledgers or opts.view:
                raise InvalidOptionError("a streaming read follows one stream: load(\"events\"), without ledgers or "
                                         "view")
            if opts.ending_offset is not None:
                raise InvalidOptionError("endingOffsets is for batch reads; a streaming query reads on as data arrives")
            return LedgerStreamReader(opts, stream_opts, schema, raw=_stream(opts, shared=False).format != ARROW)
        except Exception as exc:   # raised from here, pyspark would hide it (RefusedStreamReader says how)
            return RefusedStreamReader(exc)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from connector.spark.errors import InvalidOptionError
        from connector.spark.stream_options import StreamOptions
        from connector.spark.stream_write import LedgerStreamWriter

        opts, stream_opts = StreamOptions.parse(self.options)
        opts.check_writable()
        if overwrite:
            raise InvalidOptionError(
                "output mode complete would rewrite the whole stream every micro-batch; use outputMode(\"append\")"
            )
        return LedgerStreamWriter.prepare(opts, stream_opts, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from connector.spark.write import LedgerWriter

        opts = self._options()
        opts.check_writable()
        return LedgerWriter.prepare(opts, schema, overwrite)


def read_schema(record: StreamRecord, include_metadata: bool) -> StructType:
    from connector.spark.commit import ARROW
    from connector.spark.errors import SchemaMismatchError
    from connector.spark.schema import decode_schema, raw_read_schema, spark_schema_of, stream_read_schema

    if record.format != ARROW:
        return raw_read_schema(include_metadata)
    if not record.schema:
        raise SchemaMismatchError(f"stream {record.name!r} has no schema yet: nothing was written to it with Spark")
    return stream_read_schema(spark_schema_of(decode_schema(record.schema)), include_metadata)


def _stream(opts: LedgerOptions, shared: bool = True) -> StreamRecord:
    """The stream's record, read through the driver-side steps' shared client (task_client.py); shared=False for
    a streaming source, whose Python process runs the query's source alone for as long as it runs and keeps a
    client of its own there (stream_read.py): a shared one would stay open beside it, idle."""
    from metadata.streams import read_stream

    if not shared:
        from metadata.store import MetadataStore
        with MetadataStore(opts.metadata) as store:
            return read_stream(store, opts.stream).value
    from connector.spark.task_client import driver_client
    with driver_client(opts) as lc:
        return read_stream(lc.store, opts.stream).value
