"""`ledger list|show|read|recover|delete|nodes`: inspect and repair ledgers with the ledger client.

Like BookKeeper's shell: reading never fences a writer unless asked to (`--recover`), and deleting a
ledger a stream still holds is refused (naming the stream) unless forced.
"""
from __future__ import annotations

import argparse
import base64
import dataclasses
import datetime
import json
import sys

from connector.client import LedgerClient
from connector.commands import arguments, node_security
from connector.commands.arguments import add_metadata, default_password, password
from connector.commands.command_client import open_client
from metadata import registry, streams
from metadata.errors import LedgerError
from metadata.model import LedgerMetadata, NodeRegistration

STREAM_TAG = "stream"  # the custom metadata tag every stream ledger carries (stream writer, Spark tasks)
COMPACTION_TAG = "compaction"  # and the one a compaction's new ledgers carry (connector/compaction.py)


class LedgerHeldError(LedgerError):
    """The ledger belongs to a stream: deleting it would break every later read of the stream."""


def register(subparsers) -> None:
    def command(name: str, help: str, func, json_output: bool = False) -> argparse.ArgumentParser:
        sub = subparsers.add_parser(name, help=help)
        add_metadata(sub)
        node_security.add_arguments(sub)
        if json_output:
            sub.add_argument("--json", action="store_true", help="print JSON (one object per line for lists)")
        sub.set_defaults(func=func)
        return sub

    command("list", "list ledgers with their state and last entry", run_list, json_output=True)
    command("show", "show a ledger's metadata with its fragments", run_show,
            json_output=True).add_argument("ledger_id", type=arguments.ledger_id)
    read = command("read", "print a ledger's entries (an OPEN ledger up to its LAC, without fencing)", run_read)
    read.add_argument("ledger_id", type=arguments.ledger_id)
    read.add_argument("--from", dest="first", type=int, default=0, help="first entry (default 0)")
    read.add_argument("--to", dest="last", type=int, default=None,
                      help="last entry (default and at most: the last readable one)")
    read.add_argument("--password", type=password, default=default_password(), help="the ledger's password")
    read.add_argument("--format", choices=("text", "hex", "rows", "json"), default="text",
                      help="text (UTF-8, else hex), hex, rows (Arrow entries of Spark streams as JSON rows), or "
                           "json (one object per entry: entry_id and payload, or payload_base64)")
    read.add_argument("--json", dest="format", action="store_const", const="json", help="the same as --format json")
    read.add_argument("--recover", action="store_true",
                      help="fence and close an OPEN ledger first (its writer can add no more), then read it all")
    read.add_argument("--no-recover", dest="recover", action="store_false", help=argparse.SUPPRESS)
    recover = command("recover", "fence and close an OPEN ledger (its writer is fenced)", run_recover)
    recover.add_argument("ledger_id", type=arguments.ledger_id)
    recover.add_argument("--password", type=password, default=default_password(), help="the ledger's password")
    delete = command("delete", "delete a ledger (refused for a ledger a stream holds)", run_delete)
    delete.add_argument("ledger_id", type=arguments.ledger_id)
    delete.add_argument("--force", action="store_true",
                        help="delete even a ledger a stream holds (its offsets become unreadable)")
    command("nodes", "list the storage nodes registered in the metadata", run_nodes, json_output=True)


def run_list(args) -> int:
    with open_client(args) as client:
        if not args.json:
            print(f"{'ledger':>10}  {'state':<11}  {'last entry':>10}  {'E/WQ/AQ':<8}  {'length':>12}  writer")
        for ledger_id in client.list_ledgers():
            try:
                meta = client.ledger_metadata(ledger_id)
            except LedgerError:
                continue  # deleted while listed
            dangling = client.is_dangling(meta)
            if args.json:
                print(json.dumps(dict(as_json(meta), dangling=dangling)))
                continue
            alive = "dangling" if dangling else ""
            print(f"{meta.ledger_id:>10}  {meta.state.value:<11}  {meta.last_entry_id:>10}  "
                  f"{quorums(meta):<8}  {meta.length:>12}  {meta.writer_id} {alive}".rstrip())
    return 0


def run_show(args) -> int:
    with open_client(args) as client:
        meta = client.ledger_metadata(args.ledger_id)
        print(json.dumps(as_json(meta), indent=2) if args.json else describe(meta))
    return 0


def run_read(args) -> int:
    with open_client(args) as client:
        reader = client.open_ledger(args.ledger_id, password=args.password, recover=args.recover)
        first, last = readable_range(args.ledger_id, args.first, args.last, reader.last_entry_id, reader.is_closed)
        if first > last:
            return 0
        out = sys.stdout
        for entry in reader.read(first, last):
            for line in entry_lines(args.format, args.ledger_id, entry):
                out.write(line + "\n")
    return 0


def readable_range(ledger_id: int, first: int, last: int | None, readable: int, closed: bool) -> tuple[int, int]:
    """--from/--to checked against what can be read: --to is clamped to the last readable entry."""
    end = "its last entry" if closed else "its LAC (it is OPEN; `--recover` closes it first)"
    if first < 0 or (last is not None and last < first):
        raise LedgerError(f"cannot read entries {first}..{last} of ledger {ledger_id}: give 0 <= --from <= --to")
    if first > readable:
        print(f"ledger {ledger_id}: nothing to read from entry {first}; {end} is {readable}", file=sys.stderr)
        return first, first - 1
    if last is not None and last > readable:
        print(f"ledger {ledger_id}: reading up to entry {readable}, {end}", file=sys.stderr)
    return first, readable if last is None else min(last, readable)


def run_recover(args) -> int:
    with open_client(args) as client:
        meta = client.recover_ledger(args.ledger_id, password=args.password)
        print(f"ledger {meta.ledger_id} is {meta.state.value} at last entry {meta.last_entry_id}")
    return 0


def run_delete(args) -> int:
    with open_client(args) as client:
        meta = client.ledger_metadata(args.ledger_id)
        holder = holding_stream(client, meta)
        if holder is not None and not args.force:
            raise LedgerHeldError(
                f"ledger {meta.ledger_id} holds offsets of stream {holder!r}: deleting it would make every later "
                f"read of the stream fail; truncate the stream instead (`ledger stream truncate {holder} "
                "--before OFFSET`), or pass --force")
        client.delete_ledger(args.ledger_id)
        print(f"ledger {args.ledger_id} deleted" + (f" (it held offsets of stream {holder!r})" if holder else ""))
    return 0


def holding_stream(client: LedgerClient, meta: LedgerMetadata) -> str | None:
    """The stream that holds the ledger, if any (its tag names the stream; the stream's pages say whether)."""
    name = meta.custom.get(STREAM_TAG)
    if not name:
        return None
    try:
        head = streams.find_stream(client.store, name)
    except LedgerError:
        return None  # not a valid stream name: not a stream's ledger
    if head is None:
        return None
    rewritten = COMPACTION_TAG in meta.custom   # a compaction's ledger may be in any book it rewrote
    held = streams.held_ledgers(client.store, head.value, [meta.ledger_id], rewritten=rewritten)
    return name if meta.ledger_id in held else None


# The free-text columns come last, so that a long reason does not push the others out of line.
NODE_COLUMNS = ("node", "address", "state", "disk", "metrics", "health", "read-only reason")
_SHORT = 16      # health is aligned to its short values ("ok"); a "broken: ..." one runs on into the next column


def run_nodes(args) -> int:
    """The registered nodes of any cluster, from the metadata (BookKeeper's listbookies with its bookie info)."""
    with open_client(args) as client:
        nodes = registry.list_nodes(client.store)
        retired = registry.decommissioned_nodes(client.store)
    if args.json:
        for node_id, reg in sorted(nodes.items()):
            print(json.dumps(dict(dataclasses.asdict(reg), state=reg.state.value, decommissioned=node_id in retired)))
        return 0
    rows = [NODE_COLUMNS] + [node_row(reg, node_id in retired) for node_id, reg in sorted(nodes.items())]
    widths = [max(len(row[i]) for row in rows) for i in range(len(NODE_COLUMNS) - 2)]
    widths.append(max(len(row[-2]) for row in rows if len(row[-2]) <= _SHORT))
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    return 0


def node_row(reg: NodeRegistration, decommissioned: bool = False) -> tuple[str, ...]:
    """One line of `ledger nodes`; "-" for what the node did not say (an older node's registration)."""
    state = reg.state.value + (", decommissioned" if decommissioned else "")
    disk = f"{human_bytes(reg.disk_used_bytes)} {reg.disk_fill:.0%}" if reg.disk_capacity_bytes else "-"
    return (reg.node_id, reg.address, state, disk, reg.metrics_address or "-", reg.health or "-",
            reg.read_only_reason or "-")


def human_bytes(n: int) -> str:
    """1.2 GiB, 640.0 KiB, 512 B."""
    if n < 1024:
        return f"{n} B"
    size = n / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


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


def as_json(meta: LedgerMetadata) -> dict:
    return {
        "ledger_id": meta.ledger_id, "state": meta.state.value, "last_entry_id": meta.last_entry_id,
        "length": meta.length, "ensemble_size": meta.ensemble_size, "write_quorum": meta.write_quorum,
        "ack_quorum": meta.ack_quorum, "digest_type": meta.digest_type, "writer_id": meta.writer_id,
        "created_at": meta.created_at, "custom": meta.custom,
        "fragments": [{"first_entry_id": f.first_entry_id, "ensemble": list(f.ensemble)} for f in meta.fragments],
    }


class UndecodableEntryError(LedgerError):
    """An entry that starts as an arrow entry does (or sits in an arrow stream) but cannot be decoded as one."""


def _rows(ledger_id: int, entry) -> list[str]:
    from connector.spark.encoding import MAGIC  # pyarrow, only when asked for rows
    if not entry.payload.startswith(MAGIC):
        return [printable(entry.payload)]
    try:
        return [row_line(row) for row in entry_rows(entry.payload)]
    except UndecodableEntryError as exc:
        print(f"ledger: warning: ledger {ledger_id} entry {entry.entry_id} starts as an arrow entry but is not one "
              f"({exc}); printed as hex", file=sys.stderr, flush=True)
        return [entry.payload.hex()]


def entry_rows(payload: bytes) -> list[dict]:
    """The rows of an arrow entry (of a Spark stream), for `--format rows` and `ledger stream tail`;
    UndecodableEntryError, saying why, for a payload that is no arrow entry."""
    import pyarrow as pa
    from connector.spark.encoding import decode_entry
    from connector.spark.errors import SchemaMismatchError
    try:
        return [row for batch in decode_entry(payload).batches for row in batch.to_pylist()]
    except (pa.ArrowException, SchemaMismatchError) as exc:
        raise UndecodableEntryError(str(exc)) from exc


def row_line(row: dict) -> str:
    """A row as one JSON line (values JSON has no type for, as timestamps and bytes, as their str())."""
    return json.dumps(row, default=str)


_FORMATS = {
    "text": lambda ledger_id, entry: [printable(entry.payload)],
    "hex": lambda ledger_id, entry: [entry.payload.hex()],
    "rows": _rows,
}


def entry_lines(fmt: str, ledger_id: int, entry) -> list[str]:
    """An entry as `ledger read` prints it: one JSON object, or lines of ENTRY_ID<tab>text|hex|row."""
    if fmt == "json":
        return [json.dumps({"ledger_id": ledger_id, "entry_id": entry.entry_id, **payload_fields(entry.payload)})]
    return [f"{entry.entry_id}\t{line}" for line in _FORMATS[fmt](ledger_id, entry)]


def payload_fields(payload: bytes) -> dict:
    """A payload for a JSON record: `payload` when it is printable UTF-8 text, else `payload_base64`."""
    text = _text(payload)
    return {"payload": text} if text is not None else {"payload_base64": base64.b64encode(payload).decode("ascii")}


def printable(payload: bytes) -> str:
    text = _text(payload)
    return text if text is not None else payload.hex()


def _text(payload: bytes) -> str | None:
    """The payload as text if it is printable UTF-8, else None."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() else None
