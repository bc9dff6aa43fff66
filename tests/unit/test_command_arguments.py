"""Bad values of the commands' number arguments are refused by argparse in one line that names the argument and
what it takes (connector/commands/arguments.py), before anything is read, written or waited for."""
import pathlib
import signal

import pytest

from connector import cli


@pytest.mark.parametrize("argv, message", [
    (["stream", "compact", "s", "--grace", "nan"], "argument --grace: 'nan' is not a number of seconds >= 0"),
    (["stream", "compact", "s", "--grace", "inf"], "argument --grace: 'inf' is not a number of seconds >= 0"),
    (["stream", "compact", "s", "--grace", "-5"], "argument --grace: '-5' is not a number of seconds >= 0"),
    (["stream", "compact", "s", "--grace", "1e300"], "argument --grace: '1e300' is over 2,592,000 seconds"),
    (["stream", "compact", "s", "--entry-bytes", "1"],
     "argument --entry-bytes: 1 is not within 1,024..4,194,304, the sizes an arrow entry may have (as the Spark "
     "option entryBytes)"),
    (["stream", "compact", "s", "--entry-bytes", "4194305"], "argument --entry-bytes: 4194305 is not within"),
    (["stream", "compact", "s", "--target-bytes", "abc"], "argument --target-bytes: 'abc' is not a positive integer"),
    (["stream", "compact", "s", "--max-entry-bytes", "abc"], "argument --max-entry-bytes: 'abc' is not a positive"),
    (["audit", "--watch", "-1"], "argument --watch: '-1' is not a number of seconds > 0"),
    (["audit", "--watch", "nan"], "argument --watch: 'nan' is not a number of seconds > 0"),
    (["audit", "--watch", "inf"], "argument --watch: 'inf' is not a number of seconds > 0"),
    (["audit", "--watch", "0"], "argument --watch: '0' is not a number of seconds > 0"),
    (["audit", "--watch", "1e300"], "argument --watch: '1e300' is over 86,400 seconds (a day)"),
    (["audit", "--watch", "5", "--full-every", "nan"], "argument --full-every: 'nan' is not a number of seconds > 0"),
    (["stream", "retention", "--apply", "--every", "1e300"], "argument --every: '1e300' is over 86,400 seconds"),
    (["stream", "tail", "s", "--follow", "--poll", "1e300"], "argument --poll: '1e300' is over 86,400 seconds"),
    # An audit's: a billion nodes ran ~20 s before a 100 KB message; an empty --dir started a cluster in the cwd.
    (["cluster", "start", "--nodes", "1000000000"], "argument --nodes: 1000000000 is over 100, the most storage nodes"),
    (["cluster", "start", "--nodes", "0"], "argument --nodes: '0' is not a positive integer"),
    (["cluster", "start", "--dir", ""], "argument --dir: '' is empty: give a value, or leave the option out"),
    (["cluster", "status", "--dir", ""], "argument --dir: '' is empty"),
    (["cluster", "stop", "--dir", ""], "argument --dir: '' is empty"),
    # An empty metadata URI or TLS file silently stood for $LEDGER_METADATA's, or the environment's file.
    (["list", "--metadata", ""], "argument --metadata: '' is empty"),
    (["stream", "list", "--metadata", ""], "argument --metadata: '' is empty"),
    (["node", "readonly", "n1", "--metadata", ""], "argument --metadata: '' is empty"),
    (["list", "--tls-ca", "", "--metadata", "zk://127.0.0.1:1/l"], "argument --tls-ca: '' is empty"),
    (["jobs", "--auth-token-file", "", "--metadata", "zk://127.0.0.1:1/l"], "argument --auth-token-file: '' is empty"),
    # An audit's: an OverflowError traceback from argparse, and a head storing "max_age": Infinity (no JSON).
    (["stream", "retention", "s", "--max-bytes", "9" * 400 + "G", "--metadata", "zk://127.0.0.1:1/l"],
     f"argument --max-bytes: '{'9' * 400}G' is over 1024P, the largest size retention takes"),
    (["stream", "retention", "s", "--max-bytes", "1025P", "--metadata", "zk://127.0.0.1:1/l"],
     "argument --max-bytes: '1025P' is over 1024P"),
    (["stream", "retention", "s", "--max-age", "9" * 400 + "d", "--metadata", "zk://127.0.0.1:1/l"],
     f"argument --max-age: '{'9' * 400}d' is over 36500d (a century), the longest age retention takes"),
    (["stream", "retention", "s", "--max-age", "36501d", "--metadata", "zk://127.0.0.1:1/l"],
     "argument --max-age: '36501d' is over 36500d"),
    # int() took these for ledger 1, 3 and 10: `ledger delete ' 1'` deleted ledger 1
    (["show", " 1", "--metadata", "zk://127.0.0.1:1/l"], "argument ledger_id: ' 1' is not a ledger id (an integer"),
    (["read", "\u0663", "--metadata", "zk://127.0.0.1:1/l"], "argument ledger_id: '\u0663' is not a ledger id"),
    (["delete", "1_0", "--metadata", "zk://127.0.0.1:1/l"], "argument ledger_id: '1_0' is not a ledger id"),
    (["recover", "1.0", "--metadata", "zk://127.0.0.1:1/l"], "argument ledger_id: '1.0' is not a ledger id"),
])
def test_a_bad_number_is_named_with_what_the_argument_takes(capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert message in error and "invalid" not in error, error


@pytest.mark.parametrize("minutes", ["nan", "inf", "-1", "0"])
def test_soak_refuses_minutes_that_are_not_a_finite_number_above_0(monkeypatch, minutes):
    monkeypatch.setattr("connector.commands.soak.Soak", lambda *args, **kwargs: pytest.fail("a soak started"))
    with pytest.raises(SystemExit) as exited:
        cli.main(["soak", "--minutes", minutes])
    assert "--minutes" in str(exited.value.code) and "must be a finite number above 0" in str(exited.value.code)


# A password whose bytes are not UTF-8 ($'\xff' in a shell) reaches Python as '\udcff': `.encode()` of it gave a
# UnicodeEncodeError traceback in every command below (an audit's). The shared type hands the commands the bytes.
@pytest.mark.parametrize("argv", [
    ["read", "1"], ["recover", "1"], ["jobs"], ["audit"], ["decommission", "node-1"],
    ["stream", "truncate", "s", "--before", "1"], ["stream", "retention", "s"], ["stream", "delete", "s"],
    ["stream", "compact", "s"], ["stream", "tail", "s"], ["stream", "lag", "--checkpoint", "/c"],
])
def test_every_password_option_takes_the_bytes_the_shell_passed(argv):
    def parsed(*password: str):
        args = cli.build_parser(argv[0]).parse_args([*argv, *password])
        return args.passwords if hasattr(args, "passwords") else args.password

    assert parsed("--password", "\udcff") in (b"\xff", [b"\xff"])
    assert parsed("--password", "pé") in (b"p\xc3\xa9", [b"p\xc3\xa9"])   # UTF-8, as .encode() gave
    assert parsed() in (b"", None)


@pytest.fixture
def sigterm_kept():
    """A soak's run() sets its own SIGTERM handler: this process gets its own back."""
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_soak_refuses_a_dir_it_cannot_use_in_one_line(tmp_path, capsys, sigterm_kept):
    """An audit's: `--dir FILE` gave a NotADirectoryError traceback, `--dir /proc/nope` a FileNotFoundError one."""
    file = tmp_path / "file"
    file.write_text("kept")
    with pytest.raises(SystemExit) as exited:
        cli.main(["soak", "--dir", str(file), "--minutes", "0.01"])
    assert exited.value.code == 2
    assert f"argument --dir: '{file}' is a file, not a directory" in capsys.readouterr().err
    for where, why in ((file / "sub", "Not a directory"), (pathlib.Path("/proc/nope"), "No such file or directory")):
        with pytest.raises(SystemExit) as exited:
            cli.main(["soak", "--dir", str(where), "--minutes", "0.01"])
        assert exited.value.code == (f"ledger soak: --dir {where} cannot hold the soak ({why}); give a new or empty "
                                     "directory this user can write")
    assert file.read_text() == "kept"


# An audit's: each of these ran (some for 25 s of setup) before failing with a traceback, or exited 0.
@pytest.mark.parametrize("argv, message", [
    (["node", "--seconds", "-1"], "argument --seconds: '-1' is not a number of seconds > 0"),
    (["node", "--small-batch", "0"], "argument --small-batch: '0' is not a positive integer"),
    (["node", "--warmup", "nan"], "argument --warmup: 'nan' is not a number of seconds >= 0"),
    (["client", "--recovery-lengths", "1000,abc"], "argument --recovery-lengths: 'abc' is not a positive integer"),
    (["client", "--small-window", "-5"], "argument --small-window: '-5' is not a positive integer"),
    (["stream", "--rate", "0"], "argument --rate: '0' is not a number > 0"),
    (["stream", "--sink-seconds", "inf"], "argument --sink-seconds: 'inf' is not a number of seconds > 0"),
    (["history", "--size", "abc"], "argument --size: 'abc' is not a size: give bytes with an optional unit"),
    (["history", "--ledgers", "-1"], "argument --ledgers: '-1' is not a positive integer"),
    (["spark", "--entry-bytes", "1"], "argument --entry-bytes: 1 is not within 1,024..4,194,304"),
    (["spark", "--dir", ""], "argument --dir: '' is empty"),
])
def test_a_benchmarks_bad_argument_is_refused_before_it_starts(capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        cli.build_parser("bench").parse_args(["bench", *argv])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert message in error and "invalid" not in error, error


@pytest.mark.parametrize("bench", ["node", "client", "spark"])
def test_a_benchmarks_dir_that_is_a_file_is_refused_before_it_starts(capsys, tmp_path, bench):
    (tmp_path / "file").write_text("kept")
    with pytest.raises(SystemExit):
        cli.build_parser("bench").parse_args(["bench", bench, "--dir", str(tmp_path / "file")])
    assert f"argument --dir: '{tmp_path / 'file'}' is a file, not a directory" in capsys.readouterr().err


def test_the_benchmarks_defaults_still_parse():
    for bench in ("node", "client", "spark", "stream", "history"):
        cli.build_parser("bench").parse_args(["bench", bench])
    assert cli.build_parser("bench").parse_args(["bench", "client"]).recovery_lengths == [1000, 100000]
