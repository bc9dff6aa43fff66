"""LedgerDataSource: the `ledger` format for spark.read / df.write.

    spark.dataSource.register(LedgerDataSource)
    spark.read.format("ledger").option("metadata", uri).load("events")
    df.write.format("ledger").mode("append").save("events")
"""
from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from connector.spark.commit import ARROW
from connector.spark.errors import InvalidOptionError, SchemaMismatchError
from connector.spark.options import LedgerOptions
from connector.spark.read import ledger_reader
from connector.spark.stream_options import StreamOptions
from connector.spark.stream_read import LedgerStreamReader
from connector.spark.stream_write import LedgerStreamWriter
from connector.spark.schema import decode_schema, raw_read_schema, spark_schema_of, stream_read_schema
from connector.spark.view import VIEW_SCHEMA, LedgerViewReader
from connector.spark.write import LedgerWriter
from metadata.model import StreamRecord
from metadata.store import MetadataStore
from metadata.streams import read_stream


class LedgerDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "ledger"

    def _options(self) -> LedgerOptions:
        return LedgerOptions.parse(self.options)

    def schema(self) -> StructType:
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
        opts = self._options()
        opts.check_readable()
        if opts.view:
            return LedgerViewReader(opts)
        raw = bool(opts.ledgers) or _stream(opts).format != ARROW
        return ledger_reader(opts, schema, raw)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts, stream_opts = StreamOptions.parse(self.options)
        if not opts.stream or opts.ledgers or opts.view:
            raise InvalidOptionError("a streaming read follows one stream: load(\"events\"), without ledgers or view")
        if opts.ending_offset is not None:
            raise InvalidOptionError("endingOffsets is for batch reads; a streaming query reads on as data arrives")
        return LedgerStreamReader(opts, stream_opts, schema, raw=_stream(opts).format != ARROW)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        opts, stream_opts = StreamOptions.parse(self.options)
        opts.check_writable()
        if overwrite:
            raise InvalidOptionError(
                "output mode complete would rewrite the whole stream every micro-batch; use outputMode(\"append\")"
            )
        return LedgerStreamWriter.prepare(opts, stream_opts, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        opts = self._options()
        opts.check_writable()
        return LedgerWriter.prepare(opts, schema, overwrite)


def read_schema(record: StreamRecord, include_metadata: bool) -> StructType:
    if record.format != ARROW:
        return raw_read_schema(include_metadata)
    if not record.schema:
        raise SchemaMismatchError(f"stream {record.name!r} has no schema yet: nothing was written to it with Spark")
    return stream_read_schema(spark_schema_of(decode_schema(record.schema)), include_metadata)


def _stream(opts: LedgerOptions) -> StreamRecord:
    with MetadataStore(opts.metadata) as store:
        return read_stream(store, opts.stream).value
