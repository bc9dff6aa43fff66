"""`ledger node ...`: run a storage node in the foreground (the storage_node package's own CLI).

The connector never imports storage_node (DESIGN section 2), so this hands over to its process.
"""
from __future__ import annotations

import argparse
import os
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "node", help="run a storage node in the foreground (see `ledger node --help`)", add_help=False,
        prefix_chars="\0",
    )
    parser.add_argument("node_args", nargs=argparse.REMAINDER)
    parser.set_defaults(func=run)


def run(args) -> int:
    os.execv(sys.executable, [sys.executable, "-m", "storage_node", *args.node_args])
    return 0
