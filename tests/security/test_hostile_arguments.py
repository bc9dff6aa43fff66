"""Hostile Spark options and CLI arguments: clear errors (InvalidOptionError / `ledger: error:` / usage), never a
traceback, and nothing written to the metadata."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kazoo.client import KazooClient

from connector.cli import main
from connector.client import LedgerClient
from connector.spark.errors import InvalidOptionError
from connector.spark.options import SPELLING, LedgerOptions
from metadata.errors import LedgerError
from metadata.store import MetadataUri

NUMBERS = st.one_of(st.integers(-(1 << 70), 1 << 70), st.sampled_from([0, -1, 1, 2, 3, (1 << 63) - 1, 1 << 63]))
VALUES = st.one_of(
    st.text(max_size=30),
    NUMBERS.map(str),
    st.sampled_from(["true", "false", "TRUE", " true ", "earliest", "latest", "none", "lz4", "zstd", "ledgers",
                     "1,2,3", "1,,2", "-1", "1e3", "0x10", "zk://127.0.0.1:1/x", "zk://u:hunter2@h:1/r", "zk://u:hunter2@h:1", "zk://",
                     "events", "a/b", "..", "", " ", "\0", "💥"]),
)
KEYS = st.one_of(st.sampled_from(sorted(SPELLING)), st.sampled_from(sorted(SPELLING.values())), st.text(max_size=12))


@settings(max_examples=1500, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(options=st.dictionaries(KEYS, VALUES, max_size=8))
def test_spark_options_either_parse_or_raise_invalid_option_error(options):
    try:
        parsed = LedgerOptions.parse(options)
    except InvalidOptionError as exc:
        assert isinstance(exc, LedgerError) and str(exc)
        if str(exc).startswith("option metadata"):
            assert "hunter2" not in str(exc)  # a secret in the metadata URI is never echoed
        return
    assert parsed.ensemble_size >= parsed.write_quorum >= parsed.ack_quorum >= 1


# Every command that only reads (the ones that write need --yes, --force or --apply, never generated here), and
# `init`, which changes nothing on an initialised root.
COMMANDS = st.sampled_from([["init"], ["show"], ["read"], ["recover"], ["list"], ["nodes"], ["stream", "list"],
                            ["stream", "show"], ["stream", "truncate"], ["stream", "retention"],
                            ["stream", "compact"], ["stream", "lag"], ["stream", "tail"], ["jobs"], ["audit"]])
ARGUMENTS = st.lists(st.one_of(
    NUMBERS.map(str),
    st.sampled_from(["--from", "--to", "--password", "--no-recover", "--tls-ca", "--tls-cert", "--tls-key",
                     "--auth-token-file", "--metadata", "zk://bad", "zk://127.0.0.1:notaport/ledgers",
                     "/nonexistent.pem", "-", "--", "--bogus", "--json", "--format", "rows", "hex", "text",
                     "--max-age", "7 days", "1s", "--max-bytes", "events", "kept", "--checkpoint", "/nonexistent",
                     "--max-rows", "earliest", "latest"]),
    st.text(max_size=10),
), max_size=6)


def test_cli_arguments_give_clear_errors_and_write_nothing(cluster, metadata_uri, zookeeper, monkeypatch, capsys):
    cluster(3)
    # A root nobody initialised: every command but `init` refuses it in one line and leaves it absent.
    uninitialised = zookeeper.uri(MetadataUri.parse(metadata_uri).root + "-never-initialised")
    zk = KazooClient(hosts=zookeeper.address)
    zk.start(timeout=15)
    monkeypatch.setenv("LEDGER_METADATA", metadata_uri)
    with LedgerClient(metadata_uri) as lc:
        with lc.create_ledger(3, 2, 2) as w:
            w.append(b"kept")
        before = {i: lc.store.read_ledger(i) for i in lc.list_ledgers()}

    @settings(max_examples=120, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(command=COMMANDS, arguments=ARGUMENTS, elsewhere=st.booleans())
    def hostile(command, arguments, elsewhere):
        if elsewhere:
            arguments = ["--metadata", uninitialised, *arguments]
        root = MetadataUri.parse(uninitialised).root
        try:
            status = main([*command, *arguments])
        except SystemExit as usage:  # argparse: a usage message, exit status 2
            assert usage.code == 2
            assert "usage:" in capsys.readouterr().err
            return
        out, err = capsys.readouterr()
        assert status in (0, 1), (command, arguments)
        assert status == 0 or err.startswith("ledger: error:"), err
        assert "Traceback" not in err
        if command == ["init"] and zk.exists(root):
            zk.delete(root, recursive=True)   # an init may have made it: gone again for the next example
        assert zk.exists(root) is None, (command, arguments)

    try:
        hostile()
    finally:
        zk.stop()
        zk.close()
    with LedgerClient(metadata_uri) as lc:
        assert {i: lc.store.read_ledger(i) for i in lc.list_ledgers()} == before


@pytest.mark.parametrize("argv, message", [
    (["read", "999999"], "does not exist"),
    (["show", "-5"], "does not exist"),
    (["read", "0", "--tls-cert", "/nonexistent.pem"], "CA bundle"),
    (["read", "0", "--tls-ca", "/nonexistent.pem"], "cannot read the CA bundle"),
    (["list", "--metadata", "zk://user:hunter2@127.0.0.1"], "not of the form"),
])
def test_cli_errors_say_what_happened_without_leaking_secrets(cluster, metadata_uri, monkeypatch, capsys, argv,
                                                              message):
    monkeypatch.setenv("LEDGER_METADATA", metadata_uri)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("ledger: error:") and message in err and "hunter2" not in err


def test_spark_tls_options_reach_every_client_and_half_settings_are_refused(pki, tmp_path):
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    options = LedgerOptions.parse({"tlsca": str(pki.ca.cert), "tlscert": str(pki.client.cert),
                                   "tlskey": str(pki.client.key), "authtokenfile": str(token),
                                   "metadata": "zk://spark:hunter2@127.0.0.1:2181/ledgers"})
    assert options.client_options() == {"tls": pki.client_tls(), "auth_token": "t0ken", "max_entry_bytes": 8 << 20,
                                        "speculative_read_timeout": 0.5}
    assert options.metadata == "zk://spark:hunter2@127.0.0.1:2181/ledgers"  # credentials kept for the clients
    assert "hunter2" not in repr(options)
    with pytest.raises(InvalidOptionError, match="go together"):
        LedgerOptions.parse({"tlsCa": str(pki.ca.cert), "tlsCert": str(pki.client.cert)})
    with pytest.raises(InvalidOptionError, match="tlsKey='/nonexistent.pem': no such file"):
        LedgerOptions.parse({"tlsKey": "/nonexistent.pem"})
