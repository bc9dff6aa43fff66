"""`ledger node ...`: run a storage node in the foreground (the storage_node package's own CLI), or
`ledger node readonly NODE [--off]`: the operator's drain switch (seed 002).

The connector never imports storage_node (DESIGN section 2): running a node hands over to its process,
and the read-only switch is a persistent flag in ZooKeeper that the node watches.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from connector.commands.arguments import add_metadata
from connector.commands.command_client import CONNECT_TIMEOUT
from metadata import registry
from metadata.errors import LedgerError
from metadata.model import NodeState
from metadata.store import MetadataStore, redact_uri

READONLY_WAIT_SECONDS = 10.0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "node", add_help=False, prefix_chars="\0",
        help="run a storage node in the foreground (see `ledger node --help`), or "
             "`ledger node readonly NODE [--off]` to drain one",
    )
    parser.add_argument("node_args", nargs=argparse.REMAINDER)
    parser.set_defaults(func=run)


def run(args) -> int:
    if args.node_args[:1] == ["readonly"]:
        return run_readonly(_readonly_parser().parse_args(args.node_args[1:]))
    os.execv(sys.executable, [sys.executable, "-m", "storage_node", *args.node_args])
    return 0


def _readonly_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ledger node readonly",
        description="Make a storage node read-only (normal adds are refused; reads and recovery go on) or, with "
                    "--off, writable again. The flag is kept in ZooKeeper, so it survives node restarts. "
                    "Draining a node this way and letting its ledgers age out is the safe way to retire it.",
    )
    parser.add_argument("node_id", help="the node's id, as in `ledger cluster status`")
    parser.add_argument("--off", action="store_true", help="clear the flag: the node takes adds again "
                                                           "(unless its disk is over the threshold)")
    add_metadata(parser)
    return parser


def run_readonly(args) -> int:
    registry.check_node_id(args.node_id)
    with MetadataStore(args.metadata, connect_timeout=CONNECT_TIMEOUT) as store:
        if registry.read_cookie(store, args.node_id) is None:
            raise LedgerError(f"no storage node {args.node_id!r} ever joined the cluster at "
                              f"{redact_uri(args.metadata)} (it has no cookie); check the id with "
                              "`ledger cluster status`")
        registry.set_readonly(store, args.node_id, not args.off)
        flag = "off" if args.off else "on"
        state = _registered_state(store, args.node_id, want_read_only=not args.off)
    if state is None:
        print(f"read-only flag of node {args.node_id} is {flag}; the node is not running and applies it when it starts")
    else:
        print(f"read-only flag of node {args.node_id} is {flag}; the node reports state {state}")
    return 0


def _registered_state(store: MetadataStore, node_id: str, want_read_only: bool) -> str | None:
    """The state the running node publishes once it has seen the flag (a disk over its threshold may keep
    it read-only after --off); None when the node is not registered."""
    deadline = time.monotonic() + READONLY_WAIT_SECONDS
    while True:
        reg = registry.list_nodes(store).get(node_id)
        if reg is None:
            return None
        if (reg.state is NodeState.READ_ONLY) == want_read_only or time.monotonic() >= deadline:
            return reg.state.value
        time.sleep(0.1)
