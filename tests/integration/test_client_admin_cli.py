"""`ledger list|show|read|recover|delete|nodes` against real nodes, through connector.cli.main."""
import json
import socket
import subprocess
import sys

import pytest

from connector.cli import main
from connector.client import LedgerClient, Streams
from metadata.model import LedgerState


def test_admin_commands(cluster, metadata_uri, capsys, monkeypatch):
    cluster(4)
    with LedgerClient(metadata_uri) as client:
        closed = client.create_ledger(3, 3, 2, custom_metadata={"stream": "events"})
        for i in range(5):
            closed.append(b"event-%d" % i)
        closed.close()
        dangling = client.create_ledger(3, 2, 2)
        dangling.append(b"left open")
        monkeypatch.setenv("LEDGER_METADATA", metadata_uri)  # the default of --metadata

        assert main(["list"]) == 0
        listing = capsys.readouterr().out
        assert f"{closed.ledger_id:>10}  CLOSED" in listing and f"{dangling.ledger_id:>10}  OPEN" in listing

        assert main(["show", str(closed.ledger_id), "--metadata", metadata_uri]) == 0
        shown = capsys.readouterr().out
        assert "state         CLOSED" in shown and "last entry    4" in shown and "stream = events" in shown
        assert ", ".join(closed.metadata.last_fragment.ensemble) in shown

        assert main(["read", str(closed.ledger_id), "--from", "1", "--to", "2"]) == 0
        assert capsys.readouterr().out == "1\tevent-1\n2\tevent-2\n"

        assert main(["read", str(dangling.ledger_id), "--recover"]) == 0
        assert capsys.readouterr().out == "0\tleft open\n"
        assert main(["recover", str(dangling.ledger_id)]) == 0
        assert capsys.readouterr().out == f"ledger {dangling.ledger_id} is CLOSED at last entry 0\n"
        assert client.ledger_metadata(dangling.ledger_id).state is LedgerState.CLOSED

        assert main(["delete", str(closed.ledger_id)]) == 0
        assert closed.ledger_id not in client.list_ledgers()
        assert main(["show", str(closed.ledger_id)]) == 1
        assert "does not exist" in capsys.readouterr().err


def test_read_never_fences_a_live_writer_unless_asked_and_clamps_its_range(cluster, metadata_uri, capsys):
    """Issue 16: `ledger read` of a producer's ledger used to fence it (LedgerFencedError in the producer)."""
    cluster(3)
    with LedgerClient(metadata_uri) as client:
        live = client.create_ledger(3, 3, 2)
        for i in range(3):
            live.append(b"event-%d" % i)
        assert main(["read", str(live.ledger_id), "--metadata", metadata_uri]) == 0
        seen = capsys.readouterr()
        assert seen.out.splitlines()[:2] == ["0\tevent-0", "1\tevent-1"]  # up to the LAC the nodes know
        assert live.append(b"event-3") == 3   # the producer was not fenced
        assert main(["read", str(live.ledger_id), "--from", "1", "--to", "100", "--metadata", metadata_uri]) == 0
        clamped = capsys.readouterr()
        assert clamped.out.startswith("1\tevent-1\n") and "reading up to entry" in clamped.err
        assert main(["read", str(live.ledger_id), "--from", "5", "--to", "2", "--metadata", metadata_uri]) == 1
        refused = capsys.readouterr().err
        assert "give 0 <= --from <= --to" in refused and "Traceback" not in refused
        assert main(["read", str(live.ledger_id), "--recover", "--metadata", metadata_uri]) == 0
        assert capsys.readouterr().out.splitlines()[-1] == "3\tevent-3"
        assert client.ledger_metadata(live.ledger_id).state is LedgerState.CLOSED


def test_a_password_that_is_not_utf8_reads_and_recovers_its_ledger(cluster, metadata_uri, capsys):
    """`--password $'\\xff'` reaches Python as '\\udcff': read and recover died with a UnicodeEncodeError traceback (an
    audit's). The password is the bytes the shell passed."""
    cluster(3)
    with LedgerClient(metadata_uri) as client:
        read, recovered = (client.create_ledger(3, 2, 2, password=b"\xff") for _ in range(2))
        read.append(b"kept")
        recovered.append(b"kept too")
        # --recover: the entry is read whether or not the nodes have learnt its LAC yet
        assert main(["read", str(read.ledger_id), "--recover", "--password", "\udcff", "--metadata", metadata_uri]) == 0
        assert capsys.readouterr().out == "0\tkept\n"
        assert main(["recover", str(recovered.ledger_id), "--password", "\udcff", "--metadata", metadata_uri]) == 0
        assert client.ledger_metadata(recovered.ledger_id).state is LedgerState.CLOSED


def test_a_password_in_ledger_password_keeps_it_off_the_command_line(cluster, metadata_uri, capsys, monkeypatch):
    """Security audit: a ledger password could only be given as --password, which `ps` shows every local user.
    $LEDGER_PASSWORD is its default; --password still wins, and a repeatable --password falls back to it too."""
    from connector.commands.arguments import default_passwords

    cluster(3)
    with LedgerClient(metadata_uri) as client:
        ledger = client.create_ledger(3, 2, 2, password=b"s3cret")
        ledger.append(b"kept")
        read = ["read", str(ledger.ledger_id), "--recover", "--metadata", metadata_uri]
        assert main(read) == 1 and "password" in capsys.readouterr().err   # no password: refused
        monkeypatch.setenv("LEDGER_PASSWORD", "s3cret")
        assert main(read) == 0 and capsys.readouterr().out == "0\tkept\n"
        assert main([*read, "--password", "other"]) == 1   # the one given wins
        assert default_passwords(None) == [b"s3cret"] and default_passwords([b"x"]) == [b"x"]


def test_rows_of_an_entry_that_only_starts_as_arrow_are_printed_as_hex_with_a_warning(cluster, metadata_uri, capsys):
    """An audit's: `read --format rows` of an entry starting with the arrow magic but not arrow died with pyarrow's
    ArrowInvalid traceback."""
    from connector.spark.encoding import MAGIC

    cluster(3)
    with LedgerClient(metadata_uri) as client, client.create_ledger(3, 3, 2) as writer:
        writer.append(b"plain text")
        writer.append(MAGIC + b"garbage not arrow")
    assert main(["read", str(writer.ledger_id), "--format", "rows", "--metadata", metadata_uri]) == 0
    out, err = capsys.readouterr()
    assert out == f"0\tplain text\n1\t{(MAGIC + b'garbage not arrow').hex()}\n"
    assert err.startswith(f"ledger: warning: ledger {writer.ledger_id} entry 1 starts as an arrow entry but is not "
                          "one (") and err.rstrip().endswith("printed as hex"), err


def test_delete_refuses_a_ledger_a_stream_holds_unless_forced(cluster, metadata_uri, capsys):
    cluster(3)
    with LedgerClient(metadata_uri) as client:
        with Streams(client).open_writer("events") as writer:
            writer.append(b"kept")
        held = client.ledger_metadata(max(client.list_ledgers())).ledger_id
        assert main(["delete", str(held), "--metadata", metadata_uri]) == 1
        assert f"ledger {held} holds offsets of stream 'events'" in capsys.readouterr().err
        assert held in client.list_ledgers()
        assert main(["delete", str(held), "--force", "--metadata", metadata_uri]) == 0
        assert held not in client.list_ledgers()


def test_json_listings_nodes_and_version(cluster, metadata_uri, capsys):
    nodes = cluster(3)
    with LedgerClient(metadata_uri) as client, client.create_ledger(3, 3, 2) as writer:
        writer.append(b"x")
    assert main(["list", "--json", "--metadata", metadata_uri]) == 0
    (listed,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (listed["ledger_id"], listed["state"], listed["last_entry_id"]) == (writer.ledger_id, "CLOSED", 0)
    assert main(["show", str(writer.ledger_id), "--json", "--metadata", metadata_uri]) == 0
    assert json.loads(capsys.readouterr().out)["fragments"][0]["ensemble"]
    with LedgerClient(metadata_uri) as client, client.create_ledger(3, 3, 2) as binary:
        binary.append(b"\x00\xff")
    assert main(["read", str(writer.ledger_id), "--json", "--metadata", metadata_uri]) == 0
    assert json.loads(capsys.readouterr().out) == {"ledger_id": writer.ledger_id, "entry_id": 0, "payload": "x"}
    assert main(["read", str(binary.ledger_id), "--format", "json", "--metadata", metadata_uri]) == 0
    assert json.loads(capsys.readouterr().out) == {"ledger_id": binary.ledger_id, "entry_id": 0,
                                                   "payload_base64": "AP8="}
    assert main(["nodes", "--json", "--metadata", metadata_uri]) == 0
    registered = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(r["node_id"] for r in registered) == sorted(n.node_id for n in nodes)
    assert {r["address"] for r in registered} == {n.address for n in nodes}
    for r in registered:
        assert (r["state"], r["health"], r["read_only_reason"], r["decommissioned"]) == ("available", "ok", "", False)
        assert r["disk_used_bytes"] > 0 and r["disk_capacity_bytes"] > 0 and 0 < r["disk_fill"] < 1
        assert r["metrics_address"]
    assert main(["nodes", "--metadata", metadata_uri]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == ["node", "address", "state", "disk", "metrics", "health", "read-only", "reason"]
    for r, row in zip(sorted(registered, key=lambda r: r["node_id"]), rows):
        node_id, address, state, used, unit, fill, metrics, health, reason = row.split()
        assert (node_id, address, state, metrics, health, reason) == (
            r["node_id"], r["address"], "available", r["metrics_address"], "ok", "-")
        assert unit in ("B", "KiB", "MiB", "GiB", "TiB") and fill == f"{r['disk_fill']:.0%}"
    with pytest.raises(SystemExit) as version:
        main(["--version"])
    assert version.value.code == 0 and capsys.readouterr().out.startswith("ledger ")


def test_bad_uri_and_closed_pipe_end_without_a_traceback(cluster, metadata_uri):
    cluster(3)
    with LedgerClient(metadata_uri) as client:
        for _ in range(30):
            client.create_ledger(3, 3, 2).close()
    cli = [sys.executable, "-m", "connector.cli"]
    bad = subprocess.run(cli + ["list", "--metadata", "zk://127.0.0.1:notaport/ledgers"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1 and "port in 1-65535" in bad.stderr and "Traceback" not in bad.stderr
    piped = subprocess.run(" ".join(cli) + f" list --metadata {metadata_uri} | head -3", shell=True,
                           capture_output=True, text=True, timeout=60)
    assert len(piped.stdout.splitlines()) == 3 and "Traceback" not in piped.stderr, piped.stderr


def test_an_unreachable_zookeeper_is_one_line_in_seconds(tmp_path):
    """Issue 16: `ledger list` against no ZooKeeper waited 15 s and printed 7 `Connection dropped` lines."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    run = subprocess.run([sys.executable, "-m", "connector.cli", "list", "--metadata", f"zk://127.0.0.1:{port}/ledgers"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and run.stderr.count("\n") == 1, run.stderr
    assert f"cannot reach ZooKeeper at 127.0.0.1:{port} within 2s" in run.stderr
    assert "Connection dropped" not in run.stderr
