"""`ledger stream list|show|truncate|retention|delete|lag|tail`: inspect streams, drop their old ledgers, delete
them, see a streaming query's lag, print rows.

Truncation and retention remove whole closed ledgers from a stream's front in one compare-and-set and delete
them after it (connector/retention.py). `retention --apply` is the retention loop: run it from cron, or with
--every SECONDS as a long-running process next to the cluster.

The `compact` subcommand lives in connector/commands/stream_compact.py: when that module is there, its
register_compact(subparsers) adds it to this group (as cli.py adds command modules). `lag` and `tail` live in
connector/commands/stream_lag.py and stream_tail.py.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time

from kazoo.exceptions import NotEmptyError

from connector.client import LedgerClient
from connector.commands import node_security
from connector.commands.arguments import (SIZE_UNITS, add_metadata, default_password, interval, password, positive,
                                          size)
from connector.commands.command_client import open_client
from connector.retention import (
    apply_all, held_bytes, pending_cuts, set_retention, streams_with_retention, truncate_stream,
)
from connector.spark.recovery import discard
from metadata import query_commits, streams
from metadata.errors import LedgerError, MetadataError, NoSuchStreamError
from metadata.model import Retention, StreamRecord

COMPACT_MODULE = "connector.commands.stream_compact"
DELETE_ATTEMPTS = 5   # deletes of a marked head that a cut's or compaction's late znode under it may refuse
_DURATIONS = {"ms": 0.001, "s": 1, "": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# The largest limits retention takes: finite numbers every parser of the stream's head reads (a head once stored
# "max_age": Infinity, which is no JSON), and far past any a stream will need.
MAX_RETENTION_AGE = 100 * 365 * 86400.0   # a century, in seconds
MAX_RETENTION_BYTES = SIZE_UNITS["p"] << 10     # 1024P, an exbibyte


class StreamDeleteRefusedError(LedgerError):
    """`ledger stream delete` was not confirmed."""


def register(subparsers) -> None:
    group = subparsers.add_parser("stream", help="inspect, truncate, expire (retention) and delete streams",
                                  description=__doc__.split("\n\n")[0])
    commands = group.add_subparsers(dest="stream_command", required=True, metavar="COMMAND")

    def command(name: str, help: str, func) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        add_metadata(sub)
        node_security.add_arguments(sub)
        sub.add_argument("--json", action="store_true", help="print JSON (one object per line for lists)")
        sub.set_defaults(func=func)
        return sub

    command("list", "list the streams: format, offsets, open tail, retention", run_list)
    show = command("show", "show a stream: ledgers, offsets, bytes, open tail and owner, retention, commits",
                   run_show)
    show.add_argument("name", help="the stream")
    truncate = command("truncate", "remove the stream's whole ledgers below an offset", run_truncate)
    truncate.add_argument("name", help="the stream")
    truncate.add_argument("--before", type=_offset, required=True, metavar="OFFSET",
                          help="remove every ledger that lies entirely below this offset; the stream then starts "
                               "at the first offset of the ledger holding it (offsets below are gone for good)")
    truncate.add_argument("--password", type=password, default=default_password(), help="the stream's ledger password")
    retention = command("retention", "show or set a stream's retention, or apply retention (--apply)", run_retention)
    retention.add_argument("name", nargs="?", help="the stream (with --apply: default every stream with a retention)")
    retention.add_argument("--max-age", type=_duration, metavar="AGE",
                           help="remove closed ledgers last written longer ago: 7d, 12h, 30m, 90s; none removes "
                                "the limit")
    retention.add_argument("--max-bytes", type=_size, metavar="SIZE",
                           help="remove the oldest closed ledgers while the stream holds more: 100G, 512M (powers "
                                "of 1024); none removes the limit")
    retention.add_argument("--apply", action="store_true",
                           help="apply retention now: remove the ledgers past it (and finish cuts that died)")
    retention.add_argument("--every", type=interval, metavar="SECONDS",
                           help="with --apply: keep applying it, every SECONDS, until stopped")
    retention.add_argument("--runs", type=positive, metavar="N", help="with --every: stop after N runs")
    retention.add_argument("--password", type=password, default=default_password(), help="the streams' ledger password")
    delete = command("delete", "delete a stream and its ledgers (asks for confirmation)", run_delete)
    delete.add_argument("name", help="the stream")
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    delete.add_argument("--password", type=password, default=default_password(),
                        help="the stream's ledger password (to fence and close an OPEN ledger before deleting it)")
    _register_compact(commands)
    from connector.commands.stream_lag import register_lag  # they import this module's argument types
    from connector.commands.stream_tail import register_tail
    register_lag(command)
    register_tail(command)


def _register_compact(commands) -> None:
    """The compaction engineer's `compact`, if its module is installed (like cli.py's optional COMMAND_MODULES)."""
    try:
        from connector.commands.stream_compact import register_compact
    except ModuleNotFoundError as exc:
        if exc.name != COMPACT_MODULE:
            raise
        return
    register_compact(commands)


# -- list, show ----------------------------------------------------------------------------------------


def run_list(args) -> int:
    with open_client(args) as client:
        if not args.json:
            print(f"{'stream':<24}  {'format':<6}  {'offsets':>23}  {'tail':<18}  retention")
        for name in streams.list_streams(client.store):
            found = streams.find_stream(client.store, name, deleting=True)
            if found is None:
                continue  # deleted while listed
            if found.value.deleting:   # a delete that stopped: the operator finishes it
                print(json.dumps({"name": name, "deleting": True}) if args.json else
                      f"{name:<24}  being deleted: run `ledger stream delete {name}` to finish")
                continue
            summary = _summary(found.value)
            if args.json:
                print(json.dumps(summary))
                continue
            tail = f"OPEN {summary['open_ledger']}" if summary["open_ledger"] is not None else "closed"
            print(f"{name:<24}  {summary['format']:<6}  {_offsets(summary):>23}  {tail:<18}  "
                  f"{_retention_text(found.value.retention)}")
    return 0


def run_show(args) -> int:
    with open_client(args) as client:
        record = streams.read_stream(client.store, args.name).value
        # A summary of the whole stream: it lists every book and reads every page (and, for bytes, every ledger's
        # metadata on a stream without a size retention), so its cost grows with the stream's history.
        ledgers = list(streams.iter_ledgers(client.store, record))
        pages = streams.live_pages(client.store, record)
        shown = dict(
            _summary(record),
            ledgers=len(ledgers),
            pages=len(pages),
            books=len({page.book for page in pages if page.book is not None}),
            bytes=held_bytes(client.store, record),
            first_ledger=ledgers[0].ledger_id if ledgers else None,
            commits=[{"query": query, "batch": batch}
                     for query, batch in reversed(query_commits.query_commits(client.store, record))],
            jobs=[{"job": job, "outcome": outcome} for job, outcome in reversed(record.jobs)],
            pending_cuts=[cut.state for cut in pending_cuts(client.store, record.name)],
        )
    print(json.dumps(shown, indent=2) if args.json else _describe(shown))
    return 0


def _summary(record: StreamRecord) -> dict:
    last = record.last_ledger
    open_ledger = last.ledger_id if last is not None and last.last_offset is None else None
    return {
        "name": record.name, "format": record.format, "first_offset": record.first_offset,
        "next_offset": None if open_ledger is not None else record.next_offset,
        "open_ledger": open_ledger, "open_from": last.first_offset if open_ledger is not None else None,
        "owner": record.owner or None,
        "retention": {"max_age": record.retention.max_age, "max_bytes": record.retention.max_bytes},
    }


def _offsets(summary: dict) -> str:
    if summary["open_ledger"] is not None:
        return f"{summary['first_offset']}.. (open)"
    if summary["next_offset"] == summary["first_offset"]:
        return f"empty, next {summary['next_offset']}"
    return f"{summary['first_offset']}..{summary['next_offset'] - 1}"


def _describe(shown: dict) -> str:
    lines = [
        f"stream        {shown['name']} ({shown['format']})",
        f"offsets       {_offsets(shown)}",
        f"ledgers       {shown['ledgers']:,} ({shown['pages']:,} sealed pages in {shown['books']:,} books)",
        f"bytes         {shown['bytes']:,} in closed ledgers",
    ]
    if shown["open_ledger"] is not None:
        lines.append(f"open tail     ledger {shown['open_ledger']} from offset {shown['open_from']}, "
                     f"owner {shown['owner'] or 'unknown'}")
    else:
        lines.append("open tail     none (every ledger is closed)")
    lines.append(f"retention     {_retention_text(Retention(**shown['retention']))}")
    if shown["pending_cuts"]:
        lines.append(f"pending cuts  {', '.join(shown['pending_cuts'])} (the next truncate or retention run "
                     "finishes them)")
    commits = shown["commits"]
    if not commits:
        lines.append("commits       none (no streaming query committed to it)")
    for commit in commits[:10]:
        lines.append(f"commits       query {commit['query']}: last batch {commit['batch']}")
    if len(commits) > 10:
        lines.append(f"              and {len(commits) - 10} older queries (--json lists them)")
    if shown["jobs"]:
        last = shown["jobs"][0]
        lines.append(f"jobs          {len(shown['jobs'])} recorded, last {last['job']} {last['outcome']}")
    return "\n".join(lines)


def _retention_text(retention: Retention) -> str:
    if not retention.is_set:
        return "none (keeps everything)"
    parts = []
    if retention.max_age is not None:
        parts.append(f"max age {_age_text(retention.max_age)}")
    if retention.max_bytes is not None:
        parts.append(f"max bytes {_size_text(retention.max_bytes)}")
    return ", ".join(parts)


# -- truncate, retention, delete -----------------------------------------------------------------------


def run_truncate(args) -> int:
    with open_client(args) as client:
        result = truncate_stream(client, args.name, args.before, password=args.password)
    if args.json:
        print(json.dumps(dict(dataclasses.asdict(result), cut=result.cut)))
    elif result.cut:
        print(f"stream {result.stream!r} now starts at offset {result.first_offset} (was {result.from_offset}): "
              f"{result.ledgers:,} ledgers deleted")
    else:
        print(f"stream {result.stream!r} starts at offset {result.first_offset}: nothing below offset "
              f"{args.before} lies in a whole ledger of its own; nothing removed")
    return 0


def run_retention(args) -> int:
    changing = args.max_age is not None or args.max_bytes is not None
    if (args.every is not None or args.runs is not None) and not args.apply:
        raise LedgerError("--every and --runs go with --apply: `ledger stream retention --apply --every 300`")
    if not args.apply and args.name is None:
        raise LedgerError("name a stream to show or set its retention (`ledger stream retention NAME --max-age "
                          "7d`), or apply retention with --apply")
    if changing and args.name is None:
        raise LedgerError("--max-age/--max-bytes set one stream's retention: name it")
    with open_client(args) as client:
        if changing or not args.apply:
            record = (set_retention(client.store, args.name, args.max_age, args.max_bytes) if changing
                      else streams.read_stream(client.store, args.name).value)
            _print_retention(record, args.json)
        if args.apply:
            return _apply_loop(client, args)
    return 0


def _print_retention(record: StreamRecord, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"name": record.name, "max_age": record.retention.max_age,
                          "max_bytes": record.retention.max_bytes}))
    else:
        print(f"stream {record.name!r}: retention {_retention_text(record.retention)}")


def _apply_loop(client: LedgerClient, args) -> int:
    """One pass over the streams (the named one, or every stream with a retention), or one every --every
    seconds until stopped (or --runs passes). A stream that fails is reported and the others go on. One pass
    reports every stream; a loop only those a run changed (and, on stderr, those that failed), so that its log
    grows with what it does, not with time. The exit status is that of the last run."""
    runs = 0
    while True:
        started = time.monotonic()
        failed = []
        names = [args.name] if args.name else streams_with_retention(client.store)
        for result in apply_all(client, names, password=args.password,
                                on_error=lambda name, exc: failed.append(_warn(name, exc))):
            if args.every is None or result.cut or result.finished_cuts:
                _print_result(result, args.json)
        runs += 1
        if args.every is None or (args.runs is not None and runs >= args.runs):
            return 1 if failed else 0
        time.sleep(max(0.0, args.every - (time.monotonic() - started)))


def _warn(name: str, exc: LedgerError) -> str:
    print(f"ledger: warning: stream {name!r}: retention not applied: {exc}", file=sys.stderr, flush=True)
    return name


def _print_result(result, as_json: bool) -> None:
    if as_json:
        print(json.dumps(dict(dataclasses.asdict(result), cut=result.cut)), flush=True)
    elif result.cut:
        print(f"stream {result.stream!r}: retention removed {result.ledgers:,} ledgers, offsets "
              f"{result.from_offset}..{result.first_offset - 1}; it now starts at offset {result.first_offset}",
              flush=True)
    else:
        finished = f"; finished {result.finished_cuts} cut(s) of earlier runs" if result.finished_cuts else ""
        print(f"stream {result.stream!r}: nothing past its retention{finished}", flush=True)


def run_delete(args) -> int:
    with open_client(args) as client:
        found = streams.find_stream(client.store, args.name, deleting=True)   # a delete that stopped: finish it
        if found is None:
            raise NoSuchStreamError(f"stream {args.name!r} does not exist; check the name (`ledger stream list`)")
        if not args.yes and not found.value.deleting:
            _confirm(found.value)
        # From the mark on no update lands on the stream: the head as marked and its pages name all its ledgers.
        marked = streams.mark_deleting(client.store, args.name)
        if marked is None:
            raise NoSuchStreamError(f"stream {args.name!r} was deleted meanwhile (by another `ledger stream delete`)")
        record = marked.value
        held = _every_ledger(client, record)
        try:
            compactions, not_undone = _compactions(client, record.name, args.password)
        except (LedgerError, ValueError, TypeError, KeyError) as exc:   # still delete the stream's own ledgers
            print(f"ledger: warning: the stream's compaction records were not read ({exc}); the next compaction "
                  f"or Spark job of a stream named {record.name!r} finishes them", file=sys.stderr)
            compactions, not_undone = [], [str(exc)]
        held = sorted(set(held).union(*({s.ledger_id for s in c.run + c.ledgers} for c in compactions)))
        failed = []
        for ledger_id in held:
            try:
                discard(client, ledger_id, args.password)
            except LedgerError as exc:
                failed.append(ledger_id)
                print(f"ledger: warning: ledger {ledger_id} of the deleted stream was not deleted: {exc}",
                      file=sys.stderr)
        # The records go even if a ledger of theirs stayed: one left for a stream created again under the name would
        # delete pages of that stream after its grace.
        for compaction in compactions:
            client.store.delete(compaction.path, recursive=True)
        # The head and its pages last, and only once every ledger they name is gone: a delete that stops before (or
        # leaves a ledger) is run again, and lists them all again (ZooKeeper deletes a znode's children first, so
        # deleting the pages first lost the ledgers only they named).
        if failed:
            print(f"ledger: error: {len(failed)} ledger(s) of stream {record.name!r} were not deleted; the stream stays "
                  "marked deleting: run `ledger stream delete` again (with --password if its ledgers have one)",
                  file=sys.stderr)
            if args.json:
                print(json.dumps({"name": record.name, "deleted": False, "ledgers": len(held) - len(failed),
                                  "not_deleted": failed}))
            return 1
        _delete_head(client.store, record.name)
    if args.json:
        print(json.dumps({"name": record.name, "deleted": True, "ledgers": len(held) - len(failed),
                          "not_deleted": failed}))
    else:
        print(f"stream {record.name!r} deleted, and {len(held) - len(failed):,} of its ledgers")
    return 1 if failed or not_undone else 0


def _delete_head(store, name: str) -> None:
    """The marked head and its pages. A cut or a compaction that read the head before its mark may still create a
    znode under it (its planned record, its plan mark) while the delete runs: the delete is made again then."""
    for attempt in range(DELETE_ATTEMPTS):
        try:
            streams.delete_stream(store, name)
            return
        except MetadataError as exc:
            if not isinstance(exc.__cause__, NotEmptyError) or attempt == DELETE_ATTEMPTS - 1:
                raise


def _compactions(client: LedgerClient, name: str, password: bytes) -> tuple[list, list[str]]:
    """The deleted stream's swapped compaction records (their ledgers: those a swap replaced, named in the record
    only, and the new ones), running ones undone, and those that could not be (warned about). Before 2026-11-29 a
    stream delete left them all, with their ledgers, for good."""
    from connector.compaction import stream_deleted   # here: it loads Spark's and Arrow's modules

    swapped, failed = stream_deleted(client, name, password)
    for why in failed:
        print(f"ledger: warning: compaction {why}; the next compaction or Spark job of a stream named {name!r} "
              "undoes it", file=sys.stderr)
    return swapped, failed


def _confirm(record: StreamRecord) -> None:
    if not sys.stdin.isatty():
        raise StreamDeleteRefusedError(
            f"deleting stream {record.name!r} deletes its ledgers for good; confirm with --yes (standard input "
            "is not a terminal to ask on)"
        )
    try:
        answer = input(f"delete stream {record.name!r} and all its ledgers (offsets {record.first_offset}..)? "
                       "type its name to confirm: ")
    except EOFError:   # Ctrl-D: no answer is no confirmation
        print(file=sys.stderr)
        raise StreamDeleteRefusedError(f"stream {record.name!r} not deleted: no name was typed") from None
    if answer.strip() != record.name:
        raise StreamDeleteRefusedError(f"stream {record.name!r} not deleted: the name typed did not match")


def _every_ledger(client: LedgerClient, record: StreamRecord) -> list[int]:
    """Every ledger the stream's metadata names: tail, every page (below first_offset and replaced ones too),
    and the cuts not finished, whose ledgers no page holds."""
    ids = {ledger.ledger_id for ledger in record.tail}
    for page in streams.list_pages(client.store, record.name):
        try:
            ids |= {ledger.ledger_id for ledger in streams.read_page(client.store, record.name, page)}
        except LedgerError:
            continue  # deleted meanwhile by a cut
    for cut in pending_cuts(client.store, record.name):
        ids |= {ledger.ledger_id for ledger in cut.ledgers}
    return sorted(ids)


# -- argument types ------------------------------------------------------------------------------------


def _offset(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a stream offset (an integer >= 0)")
    return value


def _duration(text: str) -> float:
    """7d, 12h, 30m, 90s, 500ms, 2w or seconds; `none` (-1) removes the limit."""
    if text.strip().lower() == "none":
        return -1.0
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w|)\s*", text.lower())
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an age: give a number with a unit, ms, s, m, h, d or w (7d, 12h), or none")
    age = float(match.group(1)) * _DURATIONS[match.group(2)]
    if not age <= MAX_RETENTION_AGE:   # inf too
        raise argparse.ArgumentTypeError(f"{text!r} is over {_age_text(MAX_RETENTION_AGE)} (a century), the longest "
                                         "age retention takes; give a shorter one, or none to keep everything")
    return age


def _size(text: str) -> int:
    """100G, 512M, 1.5T, 4096 (arguments.size); `none` (-1) removes the limit."""
    if text.strip().lower() == "none":
        return -1
    try:
        value = size(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, or none") from None
    if value > MAX_RETENTION_BYTES:
        raise argparse.ArgumentTypeError(f"{text!r} is over {_size_text(MAX_RETENTION_BYTES)}, the largest size "
                                         "retention takes; give a smaller one, or none to keep everything")
    return value


def _age_text(seconds: float) -> str:
    for unit, factor in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= factor and seconds % factor == 0:
            return f"{int(seconds // factor)}{unit}"
    return f"{seconds:g}s"


def _size_text(size: int) -> str:
    for unit in ("P", "T", "G", "M", "K"):
        factor = SIZE_UNITS[unit.lower()]
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return f"{size:,} bytes"
