"""Storage node flags: bad numbers are refused with a message naming the flag."""
from __future__ import annotations

import pytest

from storage_node.config import parse_config
from storage_node.errors import ConfigError


def base(tmp_path) -> list[str]:
    return ["--data-dir", str(tmp_path / "d"), "--port", "0", "--metadata", "zk://127.0.0.1:2181/x", "--node-id", "n"]


@pytest.mark.parametrize("flag,value", [
    ("--journal-page-cache-bytes", "-2"),
    ("--journal-segment-bytes", "1000"),
    ("--compaction-threshold", "1.5"),
    ("--gc-interval", "0"),
    ("--gc-grace", "-1"),
    ("--gc-overreplicated-interval", "-1"),
    ("--gc-overreplicated-interval", "inf"),
    ("--gc-overreplicated-interval", "nan"),
    ("--max-concurrent-rpcs", "0"),
    ("--max-lac-waiters", "0"),
])
def test_out_of_range_values_name_the_flag(tmp_path, flag, value):
    with pytest.raises(ConfigError, match=flag):
        parse_config(base(tmp_path) + [flag, value])


# An audit's: --zk-session-timeout 1e300 made kazoo's connection thread fail with a traceback, and the node then
# said it could not reach ZooKeeper. Every interval has a maximum.
@pytest.mark.parametrize("flag, value, says", [
    ("--zk-session-timeout", "1e300", "must be a finite number of seconds, at least 1 and at most 3600 (an hour"),
    ("--zk-session-timeout", "3601", "at most 3600"),
    ("--zk-session-timeout", "inf", "at most 3600"),
    ("--checkpoint-interval", "1e300", "must be a finite number of seconds above 0, at most 604800 (a week)"),
    ("--disk-check-interval", "604801", "at most 604800 (a week)"),
    ("--gc-interval", "inf", "at most 604800 (a week)"),
    ("--gc-grace", "inf", "must be 0 or more seconds, at most 604800 (a week)"),
    ("--gc-overreplicated-interval", "1e300", "at most 2592000 (30 days), or 0 (never)"),
])
def test_intervals_and_the_session_timeout_have_a_maximum(tmp_path, flag, value, says):
    with pytest.raises(ConfigError) as refused:
        parse_config(base(tmp_path) + [flag, value])
    message = str(refused.value)
    assert message.startswith(f"{flag} {float(value)} must be ") and says in message, message


@pytest.mark.parametrize("flag, value", [("--zk-session-timeout", "3600"), ("--checkpoint-interval", "604800"),
                                         ("--gc-overreplicated-interval", "2592000"), ("--gc-grace", "0")])
def test_the_maxima_themselves_are_taken(tmp_path, flag, value):
    config = parse_config(base(tmp_path) + [flag, value])
    assert getattr(config, flag.strip("-").replace("-", "_")) == float(value)


def test_page_cache_bytes_accepts_keep_all_and_zero(tmp_path):
    assert parse_config(base(tmp_path) + ["--journal-page-cache-bytes", "-1"]).journal_page_cache_bytes == -1
    assert parse_config(base(tmp_path) + ["--journal-page-cache-bytes", "0"]).journal_page_cache_bytes == 0
    assert parse_config(base(tmp_path)).journal_page_cache_bytes == 0


def test_the_metadata_uri_defaults_to_the_environment_as_for_every_command(tmp_path, monkeypatch):
    """Issue 16: `ledger node` ignored $LEDGER_METADATA."""
    rest = ["--data-dir", str(tmp_path / "d"), "--port", "0", "--node-id", "n"]
    monkeypatch.setenv("LEDGER_METADATA", "zk://127.0.0.1:2999/from-env")
    assert parse_config(rest).metadata == "zk://127.0.0.1:2999/from-env"
    assert parse_config(rest + ["--metadata", "zk://127.0.0.1:2181/x"]).metadata == "zk://127.0.0.1:2181/x"
    monkeypatch.delenv("LEDGER_METADATA")
    with pytest.raises(SystemExit):
        parse_config(rest)


CERT = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
KEY = b"-----BEGIN EC PRIVATE KEY-----\nMHc\n-----END EC PRIVATE KEY-----\n"


@pytest.mark.parametrize("flag, content, lacking", [
    ("--tls-cert", b"not a certificate", "no PEM certificate (-----BEGIN CERTIFICATE-----)"),
    ("--tls-key", CERT, "no PEM private key (-----BEGIN PRIVATE KEY-----)"),
    ("--tls-ca", KEY, "no PEM certificate (-----BEGIN CERTIFICATE-----)"),
])
def test_a_tls_file_that_is_not_pem_of_its_kind_is_refused_at_parse_time(tmp_path, flag, content, lacking):
    files = {"--tls-cert": CERT, "--tls-key": KEY, "--tls-ca": CERT, flag: content}
    args = []
    for name, data in files.items():
        (tmp_path / name.strip("-")).write_bytes(data)
        args += [name, str(tmp_path / name.strip("-"))]
    with pytest.raises(ConfigError) as refused:
        parse_config(base(tmp_path) + args)
    assert str(refused.value) == f"{flag} {tmp_path / flag.strip('-')} holds {lacking}; give a PEM file"


@pytest.mark.parametrize("node_id", ["..", ".", "a\0b", "a\tb", "a/b", "", "x" * 201, "n1\n", "a\x85"])
def test_a_node_id_follows_the_node_id_rule(tmp_path, node_id):
    """It names the node's znodes (/nodes/ID, /cookies/ID) and, in a local cluster, its directory."""
    args = base(tmp_path)
    args[args.index("--node-id") + 1] = node_id
    with pytest.raises(ConfigError, match=r"--node-id .*: use 1-200 bytes \(UTF-8\), no '/' nor control character"):
        parse_config(args)


@pytest.mark.parametrize("node_id", ["n", "node-1", "bookie_2.rack-a", "10.0.0.7:3181", "[::1]:3181", "node@rack",
                                     "_n", "a b", "x" * 200])
def test_node_ids_a_cluster_gives_are_taken(tmp_path, node_id):
    args = base(tmp_path)
    args[args.index("--node-id") + 1] = node_id
    assert parse_config(args).node_id == node_id


@pytest.mark.parametrize("flag", ["--checkpoint-interval", "--disk-check-interval", "--gc-interval",
                                  "--zk-session-timeout"])
@pytest.mark.parametrize("value", ["inf", "nan"])
def test_seconds_must_be_finite(tmp_path, flag, value):
    with pytest.raises(ConfigError, match=f"{flag} {value} must be a finite number of seconds"):
        parse_config(base(tmp_path) + [flag, value])


def test_the_over_replicated_check_runs_daily_by_default_and_0_turns_it_off(tmp_path):
    assert parse_config(base(tmp_path)).gc_overreplicated_interval == 86400
    assert parse_config(base(tmp_path) + ["--gc-overreplicated-interval", "0"]).gc_overreplicated_interval == 0


def test_call_limits_have_generous_defaults_and_long_polls_leave_room_for_other_calls(tmp_path):
    config = parse_config(base(tmp_path))
    assert (config.max_concurrent_rpcs, config.max_lac_waiters) == (10_000, 4_096)
    with pytest.raises(ConfigError, match=r"--max-lac-waiters 4096 must be 1\.\.2000 \(at most --max-concurrent-rpcs"):
        parse_config(base(tmp_path) + ["--max-concurrent-rpcs", "2000"])
    config = parse_config(base(tmp_path) + ["--max-concurrent-rpcs", "2000", "--max-lac-waiters", "500"])
    assert config.max_lac_waiters == 500
