"""`ledger stream tail NAME [--from OFFSET] [--follow] [--max-rows N]`: a stream's rows as JSON lines, as Kafka's
console consumer prints a topic's records.

Each line is one row with its offset, `_offset`, the name a Spark read with includeMetadata gives it: an
arrow stream's row has its columns (decoded as `ledger read --format rows` decodes them, admin.py), a raw
stream's entry its payload as `payload` (UTF-8 text) or `payload_base64` (anything else). --follow keeps
printing rows as they are acknowledged, like `tail -f`: it reads as any reader does, up to the live writer's
LAC, and never fences or recovers anything. Ctrl-C and a closed pipe (`| head`) end it quietly (cli.py).

Each poll reads the stream's head and only the ledgers from the next offset on (DESIGN rule 15). An arrow
ledger's rows are known once it is sealed, so an arrow stream's OPEN tail shows when its writer seals it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Iterator

from connector.client import LedgerClient, NoSuchLedgerError, Streams
from connector.commands.command_client import open_client
from connector.commands.admin import payload_fields
from connector.commands.arguments import default_password, interval, password, positive
from connector.lag import ARROW, latest_offset
from metadata import streams
from metadata.errors import OffsetsGoneError
from metadata.model import StreamLedger, StreamRecord

EARLIEST, LATEST = "earliest", "latest"
OFFSET = "_offset"     # connector.spark.schema.OFFSET, the column includeMetadata adds


def register_tail(command) -> None:
    """Adds `tail` to the `ledger stream` group; command(name, help, func) makes a subcommand with the group's
    common arguments (--metadata, security, --json: the lines are JSON either way)."""
    tail = command("tail", "print a stream's rows as JSON lines; --follow keeps printing new ones (never fences)",
                   run_tail)
    tail.add_argument("name", help="the stream")
    tail.add_argument("--from", dest="start", type=_start, default=EARLIEST, metavar="OFFSET",
                      help="the first offset to print: a stream offset, earliest (the default: the stream's first) "
                           "or latest (only rows that come after now; with --follow, as Kafka's console consumer)")
    tail.add_argument("--follow", action="store_true",
                      help="keep printing rows as they are written, until Ctrl-C, a closed pipe or --max-rows")
    tail.add_argument("--max-rows", type=positive, metavar="N", help="stop after N rows")
    tail.add_argument("--poll", type=interval, default=0.5, metavar="SECONDS",
                      help="with --follow: how often to look for new rows (default 0.5)")
    tail.add_argument("--password", type=password, default=default_password(), help="the stream's ledger password")


def run_tail(args) -> int:
    password = args.password
    left = args.max_rows
    with open_client(args) as lc:
        offset = _first_offset(lc, args.name, args.start, password)
        while True:
            try:
                for at, line in _lines(lc, args.name, offset, password):
                    sys.stdout.write(line + "\n")
                    offset = at + 1
                    if left is not None:
                        left -= 1
                        if left == 0:
                            sys.stdout.flush()
                            return 0
            except (NoSuchLedgerError, OffsetsGoneError):
                # A cut (retention, truncation, an overwrite) deleted what this pass was reading: the next pass
                # reads the head again and goes on from the stream's first offset, saying what is gone.
                if not args.follow:
                    raise
            sys.stdout.flush()
            if not args.follow:
                return 0
            time.sleep(args.poll)


def _first_offset(lc: LedgerClient, name: str, start: int | str, password: bytes) -> int:
    if isinstance(start, int):
        return start
    record = streams.read_stream(lc.store, name).value
    return latest_offset(lc, record, password) if start == LATEST else record.first_offset


def _lines(lc: LedgerClient, name: str, offset: int, password: bytes) -> Iterator[tuple[int, str]]:
    """(offset, JSON line) of every row readable now from offset on."""
    record = streams.read_stream(lc.store, name).value
    if offset < record.first_offset:
        print(f"ledger: warning: stream {name!r}: offsets {offset}..{record.first_offset - 1} are gone (truncated, "
              f"expired or overwritten); going on from offset {record.first_offset}", file=sys.stderr, flush=True)
        offset = record.first_offset
    if record.format == ARROW:
        yield from _arrow_lines(lc, record, offset, password)
        return
    for entry in Streams(lc).read(name, offset, password=password):
        yield entry.offset, json.dumps({OFFSET: entry.offset, **payload_fields(entry.payload)})


def _arrow_lines(lc: LedgerClient, record: StreamRecord, offset: int, password: bytes) -> Iterator[tuple[int, str]]:
    """The rows of the sealed ledgers holding offsets from offset on; an OPEN ledger ends them (rows unknown)."""
    for ledger in streams.iter_ledgers(lc.store, record, offset):
        if ledger.last_offset is None:
            return
        if ledger.last_offset >= max(offset, ledger.first_offset):
            yield from _ledger_lines(lc, ledger, offset, password)


def _ledger_lines(lc: LedgerClient, ledger: StreamLedger, offset: int, password: bytes) -> Iterator[tuple[int, str]]:
    from connector.commands.admin import UndecodableEntryError, entry_rows, row_line  # pyarrow: arrow streams only
    from connector.spark.encoding import entry_header
    from connector.spark.row_index import RowIndex

    meta = lc.ledger_metadata(ledger.ledger_id)
    index = RowIndex.of(meta)
    first_entry = index.first_entry(offset - ledger.first_offset) if index and offset > ledger.first_offset else 0
    handle = lc.open_ledger(ledger.ledger_id, password=password, recover=False)
    for entry in handle.read(first_entry, meta.last_entry_id):
        try:
            rows = entry_rows(entry.payload)
        except UndecodableEntryError as exc:
            print(f"ledger: warning: ledger {ledger.ledger_id} entry {entry.entry_id} of the arrow stream is not an "
                  f"arrow entry ({exc}): its rows are skipped; `ledger read {ledger.ledger_id} --from "
                  f"{entry.entry_id} --to {entry.entry_id} --format hex` prints it", file=sys.stderr, flush=True)
            continue
        first_row, _ = entry_header(entry.payload)
        for i, row in enumerate(rows):
            at = ledger.first_offset + first_row + i
            if at >= offset:
                yield at, row_line(row if OFFSET in row else {OFFSET: at, **row})


def _start(text: str) -> int | str:
    if text.strip().lower() in (EARLIEST, LATEST):
        return text.strip().lower()
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a stream offset (an integer >= 0), earliest or latest")
    return value
