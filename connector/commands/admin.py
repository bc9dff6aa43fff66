"""`ledger list|show|read|recover|delete`: inspect and repair ledgers with the ledger client."""
from __future__ import annotations

import argparse
import datetime
import sys

from connector.client import LedgerClient, default_metadata_uri
from connector.commands import node_security
from metadata.model import LedgerMetadata


def register(subparsers) -> None:
    def command(name: str, help: str, func) -> argparse.ArgumentParser:
        sub = subparsers.add_parser(name, help=help)
        sub.add_argument("--metadata", default=default_metadata_uri(),
                         help="metadata URI, zk://[user:secret@]host:port/root "
                              "(default: $LEDGER_METADATA or zk://127.0.0.1:2181/ledgers)")
        node_security.add_arguments(sub)
        sub.set_defaults(func=func)
        return sub

    command("list", "list ledgers with their state and last entry", run_list)
    command("show", "show a ledger's metadata with its fragments", run_show).add_argument("ledger_id", type=int)
    read = command("read", "print a ledger's entries", run_read)
    read.add_argument("ledger_id", type=int)
    read.add_argument("--from", dest="first", type=int, default=0, help="first entry (default 0)")
    read.add_argument("--to", dest="last", type=int, default=None, help="last entry (default: the last one)")
    read.add_argument("--password", default="", help="the ledger's password")
    read.add_argument("--no-recover", dest="recover", action="store_false",
                      help="read an OPEN ledger up to its LAC without fencing its writer")
    recover = command("recover", "fence and close an OPEN ledger (its writer is fenced)", run_recover)
    recover.add_argument("ledger_id", type=int)
    recover.add_argument("--password", default="", help="the ledger's password")
    command("delete", "delete a ledger", run_delete).add_argument("ledger_id", type=int)


def run_list(args) -> int:
    with LedgerClient(args.metadata, **node_security.client_options(args)) as client:
        print(f"{'ledger':>10}  {'state':<11}  {'last entry':>10}  {'E/WQ/AQ':<8}  {'length':>12}  writer")
        for ledger_id in client.list_ledgers():
            meta = client.ledger_metadata(ledger_id)
            alive = "dangling" if client.is_dangling(meta) else ""
            print(f"{meta.ledger_id:>10}  {meta.state.value:<11}  {meta.last_entry_id:>10}  "
                  f"{quorums(meta):<8}  {meta.length:>12}  {meta.writer_id} {alive}".rstrip())
    return 0


def run_show(args) -> int:
    with LedgerClient(args.metadata, **node_security.client_options(args)) as client:
        print(describe(client.ledger_metadata(args.ledger_id)))
    return 0


def run_read(args) -> int:
    with LedgerClient(args.metadata, **node_security.client_options(args)) as client:
        reader = client.open_ledger(args.ledger_id, password=args.password.encode(), recover=args.recover)
        last = reader.last_entry_id if args.last is None else args.last
        out = sys.stdout
        for entry in reader.read(args.first, last):
            out.write(f"{entry.entry_id}\t{printable(entry.payload)}\n")
    return 0


def run_recover(args) -> int:
    with LedgerClient(args.metadata, **node_security.client_options(args)) as client:
        meta = client.recover_ledger(args.ledger_id, password=args.password.encode())
        print(f"ledger {meta.ledger_id} is {meta.state.value} at last entry {meta.last_entry_id}")
    return 0


def run_delete(args) -> int:
    with LedgerClient(args.metadata, **node_security.client_options(args)) as client:
        client.delete_ledger(args.ledger_id)
        print(f"ledger {args.ledger_id} deleted")
    return 0


def quorums(meta: LedgerMetadata) -> str:
    return f"{meta.ensemble_size}/{meta.write_quorum}/{meta.ack_quorum}"


def describe(meta: LedgerMetadata) -> str:
    created = datetime.datetime.fromtimestamp(meta.created_at).isoformat(timespec="seconds") if meta.created_at else "?"
    lines = [
        f"ledger        {meta.ledger_id}",
        f"state         {meta.state.value}",
        f"last entry    {meta.last_entry_id}",
        f"length        {meta.length if meta.length >= 0 else 'unknown (closed by recovery)'}",
        f"E/WQ/AQ       {quorums(meta)}",
        f"digest        {meta.digest_type}",
        f"writer        {meta.writer_id}",
        f"created       {created}",
        "fragments",
    ]
    for first, last, fragment in meta.fragment_ranges():
        end = "open" if last < 0 and not meta.is_closed else str(last)
        lines.append(f"  {first:>10} .. {end:<10}  {', '.join(fragment.ensemble)}")
    if meta.custom_metadata:
        lines.append("custom")
        lines.extend(f"  {key} = {value}" for key, value in meta.custom_metadata)
    return "\n".join(lines)


def printable(payload: bytes) -> str:
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return payload.hex()
    return text if text.isprintable() else payload.hex()
