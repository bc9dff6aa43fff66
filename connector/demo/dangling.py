"""A stream owner that crashes: it puts a new OPEN ledger on the stream, appends sample rows, and never closes.

    python -m connector.demo.dangling --metadata URI --stream NAME --rows N

It prints `acknowledged LEDGER_ID ROWS ENTRIES` once every append is acknowledged and then blocks
until it is killed (the demo and the tests SIGKILL it). A later read finds the ledger OPEN with its
writer gone, recovers it and seals the stream (spans.py).
"""
from __future__ import annotations

import argparse
import signal

from connector.client import LedgerClient
from connector.demo.sample import sample_batch
from connector.spark.commit import with_open_ledger
from connector.spark.encoding import EntryBuilder, entries_of
from connector.spark.recovery import STREAM_TAG
from connector.spark.schema import decode_schema
from metadata.streams import read_stream, update_stream

ROWS_PER_BATCH = 1000


def append_open(metadata: str, stream: str, rows: int, entry_bytes: int) -> tuple[int, int, int]:
    """Returns (ledger id, rows, entries) after every append was acknowledged; leaves the ledger OPEN."""
    lc = LedgerClient(metadata)  # never closed: the process is killed while its ledger is OPEN
    schema = decode_schema(read_stream(lc.store, stream).value.schema)
    ledger = lc.create_ledger(custom_metadata={STREAM_TAG: stream, "owner": "connector.demo.dangling"})
    first_id = update_stream(lc.store, stream, lambda r: with_open_ledger(r, ledger.ledger_id)).value.last_ledger.first_offset
    batches = (sample_batch(first_id + start, min(ROWS_PER_BATCH, rows - start), schema)
               for start in range(0, rows, ROWS_PER_BATCH))
    futures = [ledger.append_async(payload) for payload in entries_of(batches, EntryBuilder(schema, entry_bytes))]
    for future in futures:
        future.result()
    return ledger.ledger_id, rows, len(futures)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--entry-bytes", type=int, default=64 * 1024)
    args = parser.parse_args(argv)
    ledger_id, rows, entries = append_open(args.metadata, args.stream, args.rows, args.entry_bytes)
    print(f"acknowledged {ledger_id} {rows} {entries}", flush=True)
    while True:
        signal.pause()  # wait to be killed: a crashed writer never closes its ledger


if __name__ == "__main__":
    main()
