"""`ledger list|show|read|recover|delete` against real nodes, through connector.cli.main."""
from connector.cli import main
from connector.client import LedgerClient
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

        assert main(["recover", str(dangling.ledger_id)]) == 0
        assert capsys.readouterr().out == f"ledger {dangling.ledger_id} is CLOSED at last entry 0\n"
        assert client.ledger_metadata(dangling.ledger_id).state is LedgerState.CLOSED

        assert main(["delete", str(closed.ledger_id)]) == 0
        assert closed.ledger_id not in client.list_ledgers()
        assert main(["show", str(closed.ledger_id)]) == 1
        assert "does not exist" in capsys.readouterr().err
