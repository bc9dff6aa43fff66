"""The `ledger` command. Each command group lives in its own module under connector/commands and
adds itself with register(subparsers); a handler is set as `func` on its parser."""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import logging
import os
import sys

from metadata.errors import LedgerError

COMMAND_MODULES = (
    "connector.commands.init",
    "connector.commands.cluster",
    "connector.commands.node",
    "connector.commands.admin",
    "connector.commands.bench",
    "connector.commands.replication",
    "connector.commands.soak",
    "connector.commands.stream",
    "connector.commands.jobs",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ledger", description="Replicated ledger store with a PySpark connector")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # kazoo logs every failed connection attempt; a command reports what failed in one line of its own.
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    try:
        return args.func(args) or 0
    except LedgerError as exc:
        print(f"ledger: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`ledger list | head`): stop quietly, as a shell tool does.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _version() -> str:
    try:
        return importlib.metadata.version("ledger-store")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


if __name__ == "__main__":
    sys.exit(main())
