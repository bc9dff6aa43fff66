"""The `ledger` command. Each command group lives in its own module under connector/commands and
adds itself with register(subparsers); a handler is set as `func` on its parser. COMMANDS says which
module registers which command (tests/unit/test_cli_commands.py holds the two together)."""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import logging
import itertools
import os
import shlex
import sys

from metadata.errors import LedgerError

# The module that registers each command. A command loads its own module only: `ledger list` starts without
# Spark, pyarrow or the benchmarks (0.4 s of CPU instead of 1.5 s); help and unknown commands load every module.
COMMANDS = {
    "init": "connector.commands.init",
    "cluster": "connector.commands.cluster",
    "node": "connector.commands.node",
    **dict.fromkeys(("list", "show", "read", "recover", "delete", "nodes"), "connector.commands.admin"),
    "bench": "connector.commands.bench",
    **dict.fromkeys(("audit", "decommission"), "connector.commands.replication"),
    "soak": "connector.commands.soak",
    "stream": "connector.commands.stream",
    "jobs": "connector.commands.jobs",
    "spark": "connector.commands.spark",
}
COMMAND_MODULES = tuple(dict.fromkeys(COMMANDS.values()))   # in the order `ledger --help` lists them
TOP_OPTIONS = ("-h", "--help", "--version")   # the only options that go before the command


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with `command`'s module registered, or every module's when command is None or unknown."""
    parser = argparse.ArgumentParser(prog="ledger", description="Replicated ledger store with a PySpark connector")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in (COMMANDS[command],) if command in COMMANDS else COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _refuse_options_before_the_command(argv)
    # The top level takes no option with a value: its first word that is not an option names the command.
    parser = build_parser(next((word for word in argv if not word.startswith("-")), None))
    args, unknown = parser.parse_known_args(argv)
    if unknown:   # argparse reports them at the top, with the top's usage: name the command's own instead
        _command_parser(parser, argv).error(f"unrecognized arguments: {' '.join(unknown)}")
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


def _refuse_options_before_the_command(argv: list[str]) -> None:
    """`ledger --metadata URI list`: argparse would take the URI for the command and say it is an invalid choice.
    Every option but the top level's own belongs to its command, after it: say so, with the line that works."""
    leading = list(itertools.takewhile(lambda word: word not in COMMANDS, argv))
    misplaced = [word for word in leading if word.startswith("-") and word.split("=", 1)[0] not in TOP_OPTIONS]
    if not misplaced:
        return
    from metadata.store import redact_uri   # here: kazoo is loaded by the commands that use ZooKeeper only

    rest = argv[len(leading):]
    example = shlex.join(rest + leading) if rest else f"COMMAND {shlex.join(leading)}"
    build_parser(rest[0] if rest else None).error(
        redact_uri(f"{misplaced[0].split('=', 1)[0]} goes after the command: ledger {example}"))


def _command_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The innermost parser that argv's command words select (`ledger stream tail ...`: stream tail's)."""
    for word in argv:
        # argparse keeps a parser's subcommands in a _SubParsersAction only (its documented add_subparsers).
        commands = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if commands is None:
            break
        parser = commands.get(word, parser)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("ledger-store")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


if __name__ == "__main__":
    sys.exit(main())
