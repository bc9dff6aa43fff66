"""`ledger COMMAND` loads the module that registers COMMAND, and no other: the table in connector/cli.py says which."""
from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import time

import pytest

from connector import cli


def registered(module_name: str) -> set[str]:
    subparsers = argparse.ArgumentParser().add_subparsers()
    importlib.import_module(module_name).register(subparsers)
    return set(subparsers.choices)


def test_the_table_names_every_command_each_module_registers_and_no_other():
    for module_name in cli.COMMAND_MODULES:
        assert registered(module_name) == {c for c, m in cli.COMMANDS.items() if m == module_name}, module_name


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_each_command_parses_with_its_module_alone(command):
    parser = cli.build_parser(command)
    try:
        args = parser.parse_args([command, "--help"])
    except SystemExit as exited:
        assert exited.code == 0
    else:
        assert command == "node" and args.node_args == ["--help"]   # handed to the storage node as they are


def test_an_admin_command_starts_without_spark_pyarrow_or_the_benchmarks():
    """`ledger list` is what an operator types most: before the table, every command imported every module."""
    code = ("import sys; from connector import cli; cli.build_parser('list'); "
            "print(sorted(m for m in ('pyspark', 'pyarrow', 'connector.bench.stream', 'connector.spark.janitor') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"


def test_help_and_an_unknown_command_still_list_every_command(capsys):
    with pytest.raises(SystemExit):
        cli.main(["no-such-command"])
    error = capsys.readouterr().err
    assert "invalid choice: 'no-such-command'" in error
    assert all(command in error for command in cli.COMMANDS)


@pytest.mark.parametrize("argv, command, unknown", [
    (["list", "--bogus"], "ledger list", "--bogus"),
    (["stream", "tail", "--bogus", "--json", "s"], "ledger stream tail", "--bogus"),
    (["spark", "compile", "extra"], "ledger spark compile", "extra"),
])
def test_an_unknown_argument_is_named_with_its_commands_usage(capsys, argv, command, unknown):
    """Not with the top's usage, which lists only the commands of the module loaded for this one."""
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith(f"usage: {command} [-h]"), error
    assert error.rstrip().endswith(f"{command}: error: unrecognized arguments: {unknown}"), error


@pytest.mark.parametrize("argv, message", [
    (["--metadata", "zk://127.0.0.1:1/l", "list"], "--metadata goes after the command: ledger list --metadata "
                                                   "zk://127.0.0.1:1/l"),
    (["--metadata=zk://u:hunter2@127.0.0.1:1/l", "stream", "list"],
     "--metadata goes after the command: ledger stream list --metadata=zk://u:***@127.0.0.1:1/l"),
    (["--json"], "--json goes after the command: ledger COMMAND --json"),
])
def test_an_option_before_the_command_is_named_with_where_it_goes(capsys, argv, message):
    """Not argparse's "invalid choice: 'zk://...'": the top level takes no option with a value."""
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.rstrip().endswith(f"ledger: error: {message}"), error
    assert "hunter2" not in error


@pytest.mark.parametrize("argv", [["node", "readonly", "n1"], ["node", "readonly", "n1", "--off"], ["list"]])
def test_a_command_gives_up_on_an_unreachable_zookeeper_after_its_short_wait(capsys, argv):
    """Every command waits CONNECT_TIMEOUT (2 s) for ZooKeeper; `node readonly` waited a store's default 15 s."""
    started = time.monotonic()
    assert cli.main([*argv, "--metadata", "zk://127.0.0.1:1/l"]) == 1
    assert time.monotonic() - started < 10
    assert "cannot reach ZooKeeper at 127.0.0.1:1 within 2s" in capsys.readouterr().err


# "n\udcff": what Python makes of the argument $'n\xff' (not UTF-8). An audit's `ledger decommission` of it waited 61 s
# and blamed ZooKeeper; of '..' it failed with ValueError's traceback; of '' it said "damaged cookie record".
@pytest.mark.parametrize("node_id", ["..", "a\tb", "a/b", "", "n\udcff"])
@pytest.mark.parametrize("command", [["node", "readonly"], ["decommission"]])
def test_node_commands_refuse_what_is_not_a_node_id_before_reaching_zookeeper(capsys, command, node_id):
    assert cli.main([*command, node_id, "--metadata", "zk://127.0.0.1:1/l"]) == 1
    assert capsys.readouterr().err == (f"ledger: error: {node_id!r} is not a storage node id (ids are 1-200 bytes "
                                       "(UTF-8), no '/' nor control character (as ZooKeeper takes names), not '.' or "
                                       "'..', not starting with '-'); check the id with `ledger cluster status`\n")


@pytest.mark.parametrize("argv", [["list"], ["init"], ["stream", "list"]])
def test_a_metadata_root_with_a_dot_segment_is_one_line_not_kazoos_traceback(capsys, argv):
    assert cli.main([*argv, "--metadata", "zk://127.0.0.1:1/ledgers/../ledgers"]) == 1
    assert capsys.readouterr().err.startswith("ledger: error: metadata URI 'zk://127.0.0.1:1/ledgers/../ledgers': its "
                                              "root /ledgers/../ledgers has a '.' or '..' segment")


@pytest.mark.parametrize("name", ["a/b", "..", ""])
def test_jobs_of_what_is_no_stream_name_is_an_invalid_stream_name(capsys, name):
    """It said there were no jobs on stream 'a/b' (an audit's): no stream can have that name."""
    assert cli.main(["jobs", "--stream", name, "--metadata", "zk://127.0.0.1:1/l"]) == 1
    assert capsys.readouterr().err.startswith(f"ledger: error: invalid stream name {name!r}: use 1-200 letters")
