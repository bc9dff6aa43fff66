"""Streams on a ledger client: the single-owner writer and the offset-order reader (DESIGN rule 14).

A stream is a chain of ledgers (its record: metadata/streams.py). It is a layer above the ledgers: as
DistributedLog's logs sit on a BookKeeper client that knows nothing of them, Streams takes a LedgerClient
and LedgerClient never imports this module or the stream reader and writer.

    from connector.client import LedgerClient, Streams
    with LedgerClient(uri) as lc:
        with Streams(lc).open_writer("events", max_ledger_entries=100_000) as sw:
            offset = sw.append(b"payload")
        for e in Streams(lc).read("events", start=0):
            e.offset, e.ledger_id, e.entry_id, e.payload, e.time_ms
"""
from __future__ import annotations

from typing import Iterator

from connector.client.api import LedgerClient
from connector.client.stream_reader import StreamEntry, read_stream
from connector.client.stream_writer import StreamWriter


class Streams:
    """The streams of the cluster `client` is connected to. It holds only the client, so making one costs
    nothing; what it opens works through that client."""

    def __init__(self, client: LedgerClient):
        self.client = client

    def open_writer(self, name: str, **options) -> StreamWriter:
        """Become the only writer of stream `name` (fencing the previous one); options: see StreamWriter."""
        return StreamWriter(self.client, name, **options)

    def read(self, name: str, start: int = 0, end: int | None = None, password: bytes = b"") -> Iterator[StreamEntry]:
        """Entries of stream `name` with start <= offset <= end, in offset order, up to the live tail's LAC."""
        return read_stream(self.client, name, start, end, password)
