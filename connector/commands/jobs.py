"""`ledger jobs [--apply] [--json]`: Spark write jobs and streaming queries, and what drivers that died left.

Lists every batch write job and streaming query that has a task registry (in flight, or left by a driver
that died), with its stream, its driver and whether that driver is alive, and its task ledgers with their
bytes. --apply deletes what the abandoned ones (every driver gone) left: their uncommitted ledgers and their
registries (connector/spark/janitor.py; a job whose driver is alive is never touched, however slow it is).
It reads the registries only, never every ledger of the cluster.

(The under-replication audit is `ledger audit`.)
"""
from __future__ import annotations

import json
import sys

from connector.commands import node_security
from connector.commands.arguments import add_metadata, default_passwords, password
from connector.commands.command_client import open_client
from connector.spark.janitor import (
    ABANDONED, UNKNOWN, Cleaned, LedgerFacts, Registry, clean, find_registries, ledger_facts,
)
from metadata.streams import check_stream_name


def register(subparsers) -> None:
    jobs = subparsers.add_parser(
        "jobs", help="list Spark write jobs and streaming queries; --apply deletes what dead drivers left",
        description="List the Spark write jobs and streaming queries that have task registries (in flight, or left "
                    "by a driver that died) with their drivers' liveness, ledgers and bytes; --apply deletes what "
                    "the abandoned ones left.",
    )
    add_metadata(jobs)
    node_security.add_arguments(jobs)
    jobs.add_argument("--stream", help="only the jobs and queries writing this stream")
    jobs.add_argument("--apply", action="store_true",
                      help="delete the uncommitted ledgers and the registries of jobs and queries whose driver is gone")
    jobs.add_argument("--legacy", action="store_true",
                      help="with --apply: also clean registries that name no driver (written by an older version); "
                           "only when no driver of that version is still running")
    jobs.add_argument("--password", dest="passwords", type=password, action="append",
                      help="password of the task ledgers, needed to fence an OPEN one; repeat for several "
                           "(default: $LEDGER_PASSWORD, else empty)")
    jobs.add_argument("--json", action="store_true", help="print one JSON object per job or query")
    jobs.set_defaults(func=run_jobs)


def run_jobs(args) -> int:
    if args.stream is not None:
        check_stream_name(args.stream)   # no job writes a stream of no valid name: say so, not "no jobs on it"
    passwords = default_passwords(args.passwords)
    with open_client(args) as lc:
        found = find_registries(lc.store, args.stream)
        facts = {(r.kind, r.owner): ledger_facts(lc.store, r.entries(lc.store)) for r in found}
        cleaned = {}
        if args.apply:
            for registry in found:
                if registry.state == ABANDONED or (args.legacy and registry.state == UNKNOWN):
                    cleaned[(registry.kind, registry.owner)] = clean(lc, registry, passwords, legacy=args.legacy)
    rows = [_row(r, facts[(r.kind, r.owner)], cleaned.get((r.kind, r.owner))) for r in found]
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        _print_table(rows, args)
    return 1 if any(row.get("outcome", {}).get("error") for row in rows) else 0


def _row(registry: Registry, facts: list[LedgerFacts], cleaned: Cleaned | None) -> dict:
    row = {
        "kind": registry.kind, "id": registry.owner, "streams": registry.streams, "drivers": registry.drivers,
        "state": registry.state,
        "ledgers": [{"id": f.ledger_id, "state": f.state, "bytes": f.bytes, "replicas": f.replicas} for f in facts],
        "bytes": sum(f.bytes for f in facts), "stored_bytes": sum(f.bytes * f.replicas for f in facts),
    }
    if cleaned is not None:
        row["outcome"] = {"deleted": cleaned.deleted, "kept": cleaned.kept, "skipped": cleaned.skipped,
                          "error": cleaned.error}
    return row


def _print_table(rows: list[dict], args) -> None:
    if not rows:
        print("no Spark write jobs or streaming queries have task registries" +
              (f" on stream {args.stream!r}" if args.stream else ""))
        return
    print(f"{'kind':<5}  {'id':<36}  {'stream':<20}  {'state':<9}  {'ledgers':>13}  {'bytes':>15}  driver")
    for row in rows:
        ledgers = row["ledgers"]
        opened = sum(1 for ledger in ledgers if ledger["state"] != "CLOSED")
        count = f"{len(ledgers)}" + (f" ({opened} open)" if opened else "")
        print(f"{row['kind']:<5}  {row['id']:<36}  {','.join(row['streams']) or '?':<20}  {row['state']:<9}  "
              f"{count:>13}  {row['bytes']:>15,}  {','.join(row['drivers']) or 'none recorded'}")
        if "outcome" in row:
            print("       " + _outcome_text(row["outcome"]))
    _print_summary(rows, args)


def _outcome_text(outcome: dict) -> str:
    if outcome["skipped"]:
        return f"left as it is: {outcome['skipped']}"
    text = f"cleaned: {len(outcome['deleted'])} ledgers deleted"
    if outcome["kept"]:
        text += f", {len(outcome['kept'])} kept (committed before its driver died)"
    if outcome["error"]:
        text += f"; stopped: {outcome['error']} (run again to finish)"
    return text


def _print_summary(rows: list[dict], args) -> None:
    abandoned = [row for row in rows if row["state"] == ABANDONED]
    legacy = [row for row in rows if row["state"] == UNKNOWN]
    if args.apply:
        done = [row for row in rows
                if "outcome" in row and not row["outcome"]["skipped"] and not row["outcome"]["error"]]
        deleted = sum(len(row["outcome"]["deleted"]) for row in done)
        print(f"cleaned {len(done)} registries of gone drivers: {deleted} ledgers deleted")
    elif abandoned:
        ledgers = sum(len(row["ledgers"]) for row in abandoned)
        stored = sum(row["stored_bytes"] for row in abandoned)
        print(f"{len(abandoned)} abandoned (every driver gone): {ledgers} ledgers, "
              f"{sum(row['bytes'] for row in abandoned):,} bytes ({stored:,} stored with replicas); "
              "`ledger jobs --apply` deletes them")
    if legacy and not (args.apply and args.legacy):
        print(f"{len(legacy)} name no driver (written by an older version): if none of them is still running, "
              "`ledger jobs --apply --legacy` deletes them", file=sys.stderr)
