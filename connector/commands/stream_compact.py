"""`ledger stream compact NAME`: rewrite a stream's runs of small closed ledgers into large ones, with the same
rows at the same offsets (connector/compaction.py). register_compact(subparsers) adds the subcommand to the
`ledger stream` group.

Every run first finishes or undoes the stream's earlier compactions (deletes the ledgers they replaced once
their grace has passed; discards the new ledgers of one whose process died), so running it again, or from
cron, is also how replaced ledgers get deleted. --wait stays until the grace has passed and deletes them now.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json

from connector.client.limits import DEFAULT_MAX_ENTRY_BYTES, MAX_SENDABLE_ENTRY_BYTES
from connector.commands import node_security
from connector.commands.arguments import (add_metadata, default_password, entry_bytes, password, positive,
                                          seconds_or_zero)
from connector.commands.command_client import open_client
from connector.compaction import (
    DEFAULT_ENTRY_BYTES, DEFAULT_GRACE, DEFAULT_TARGET_BYTES, Compaction, CompactionPolicy, CompactionResult,
    compact_stream,
)
from connector.spark.options import COMPRESSIONS, MIN_ENTRY_BYTES

# Replaced ledgers kept longer than a month are better kept as they were; the bound also keeps --wait's sleep and
# the printed due time in range.
MAX_GRACE = 30 * 86400.0


def register_compact(subparsers) -> argparse.ArgumentParser:
    compact = subparsers.add_parser(
        "compact", help="rewrite a stream's small closed ledgers into large ones (same rows, same offsets)",
        description=__doc__.split("\n\n")[1],
    )
    compact.add_argument("name", help="the stream")
    add_metadata(compact)
    node_security.add_arguments(compact)
    compact.add_argument("--password", type=password, default=default_password(),
                         help="the stream's ledger password (its new ledgers get it too)")
    compact.add_argument("--target-bytes", type=positive, default=DEFAULT_TARGET_BYTES,
                         help=f"size of a new ledger, at most (default {DEFAULT_TARGET_BYTES >> 20} MiB)")
    compact.add_argument("--small-bytes", type=positive, default=None,
                         help="ledgers under this size are rewritten (default: half of --target-bytes)")
    compact.add_argument("--min-ledgers", type=positive, default=2,
                         help="rewrite only runs of at least this many small ledgers (default 2): a threshold "
                              "for running it from cron without rewriting a few ledgers every time")
    compact.add_argument("--grace", type=_grace, default=DEFAULT_GRACE,
                         help="seconds the replaced ledgers stay readable after the swap, for reads planned "
                              f"before it (default {DEFAULT_GRACE:.0f}: a Spark job's tasks open ledgers long "
                              "after its driver planned them)")
    compact.add_argument("--entry-bytes", type=entry_bytes, default=DEFAULT_ENTRY_BYTES,
                         help="entry size of rewritten arrow ledgers (the Spark writer's entryBytes, default 1 MiB)")
    compact.add_argument("--compression", choices=COMPRESSIONS, default="none",
                         help="compression of rewritten arrow entries (default none)")
    compact.add_argument("--max-entry-bytes", type=_entry_limit, default=DEFAULT_MAX_ENTRY_BYTES,
                         help="the most bytes an entry may have, as the storage nodes' --max-entry-bytes (default "
                              f"{DEFAULT_MAX_ENTRY_BYTES >> 20} MiB, theirs): raise it with theirs to compact raw "
                              "entries larger than that")
    compact.add_argument("--wait", action="store_true",
                         help="wait for the grace and delete the replaced ledgers before returning")
    compact.add_argument("--json", action="store_true", help="print the outcome as one JSON object")
    compact.set_defaults(func=run_compact)
    return compact


def run_compact(args) -> int:
    policy = CompactionPolicy(
        target_bytes=args.target_bytes, small_bytes=args.small_bytes, min_ledgers=args.min_ledgers,
        grace=args.grace, entry_bytes=args.entry_bytes,
        compression=None if args.compression == "none" else args.compression,
    )
    progress = None if args.json else _print_step
    with open_client(args, max_entry_bytes=args.max_entry_bytes) as lc:
        result = compact_stream(lc, args.name, policy, password=args.password, wait=args.wait,
                                on_step=progress)
    if args.json:
        print(json.dumps(dataclasses.asdict(result), sort_keys=True))
    else:
        _print_summary(result)
    return 0


def _print_step(step: str, compaction: Compaction) -> None:
    run = compaction.run
    if step == "swapped":
        print(f"{compaction.compaction_id}: {len(run):,} ledgers (offsets {run[0].first_offset}.."
              f"{run[-1].last_offset}) replaced by {len(compaction.ledgers)}: "
              f"{', '.join(str(s.ledger_id) for s in compaction.ledgers)}", flush=True)
    elif step == "deleted":
        print(f"{compaction.compaction_id}: grace over, the {len(run):,} replaced ledgers deleted", flush=True)
    elif step == "abandoned":
        print(f"{compaction.compaction_id}: undone (offsets {run[0].first_offset}..{run[-1].last_offset} left as "
              "they were; its new ledgers discarded)", flush=True)


def _print_summary(result: CompactionResult) -> None:
    swapped = [r for r in result.runs if r.state == "swapped"]
    print(f"stream {result.stream!r}: {sum(r.replaced for r in swapped):,} ledgers rewritten into "
          f"{sum(len(r.ledgers) for r in swapped):,} ({len(swapped)} swaps"
          + (f", {len(result.runs) - len(swapped)} refused: the stream changed meanwhile" if len(swapped) <
             len(result.runs) else "") + ")")
    for compaction_id, due in result.pending:
        at = datetime.datetime.fromtimestamp(due).isoformat(timespec="seconds")
        print(f"{compaction_id}: replaced ledgers kept until {at} (the grace); the next `ledger stream compact "
              f"{result.stream}` after that deletes them")


def _grace(text: str) -> float:
    value = seconds_or_zero(text)
    if value > MAX_GRACE:
        raise argparse.ArgumentTypeError(f"{text!r} is over {MAX_GRACE:,.0f} seconds (30 days), the longest grace")
    return value


def _entry_limit(text: str) -> int:
    value = positive(text)
    if value < MIN_ENTRY_BYTES:
        raise argparse.ArgumentTypeError(f"{text} is under {MIN_ENTRY_BYTES:,}, the least an entry limit may be (as "
                                         "the Spark option maxEntryBytes)")
    if value > MAX_SENDABLE_ENTRY_BYTES:
        raise argparse.ArgumentTypeError(f"{text} is over {MAX_SENDABLE_ENTRY_BYTES:,}, the most one message to a "
                                         "storage node carries")
    return value
