"""`ledger audit` after a node is lost (SIGKILL, directory deleted): it lists the under-replicated ledgers,
`--repair` and the auditor (`--watch`, a separate process) re-replicate them, including an OPEN ledger with two
fragments, and then another node can be lost with every entry still reading back."""
import json
import shutil
import subprocess
import sys

from connector.cli import main
from connector.client import LedgerClient
from connector.client.rereplicate import Rereplicator
from metadata import registry
from tests.harness.ledger_data import append_entries, assert_every_entry_reads_back
from tests.harness.poll import poll_until

FAST_EXPIRY = ("--zk-session-timeout", "1")  # a killed node's registration is gone within seconds


def test_audit_finds_and_repairs_ledgers_after_a_node_is_lost(start_node, metadata_uri, capsys, tmp_path,
                                                               monkeypatch):
    originals = [start_node(None, *FAST_EXPIRY) for _ in range(3)]
    with LedgerClient(metadata_uri) as client:
        expected = {}
        for seed, (write_quorum, password) in enumerate([(2, b""), (3, b""), (2, b"pw")]):
            with client.create_ledger(3, write_quorum, 2, password=password) as writer:
                expected[writer.ledger_id] = (password, append_entries(writer, 150, seed))
        protected = next(i for i, (password, _) in expected.items() if password)
        live = client.create_ledger(3, 2, 2)  # OPEN, its writer alive
        live_entries = append_entries(live, 60, 10)
        start_node(None, *FAST_EXPIRY)
        start_node(None, *FAST_EXPIRY)

        lost = originals[0]
        lost.kill()
        shutil.rmtree(lost.data_dir)
        poll_until(lambda: lost.node_id not in registry.list_nodes(client.store), 30,
                   what=f"{lost.node_id}'s registration to expire")
        live_entries.update(append_entries(live, 60, 11))  # the writer changes its ensemble: a second fragment
        expected[live.ledger_id] = (b"", live_entries)
        assert len(live.metadata.fragments) == 2 and lost.node_id in live.metadata.fragments[0].ensemble

        assert main(["audit", "--metadata", metadata_uri]) == 1
        listing = capsys.readouterr().out
        for ledger_id in expected:
            assert f"ledger {ledger_id}" in listing
        assert f"{lost.node_id} gone (not registered)" in listing
        assert "4 under-replicated ledger(s)" in listing
        assert main(["audit", "--json", "--metadata", metadata_uri]) == 1
        *records, summary = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert summary == {"under_replicated": 4} and sorted(r["ledger_id"] for r in records) == sorted(expected)
        assert all(r["lost"] == {lost.node_id: "gone (not registered)"} for r in records)
        open_fragment = next(r for r in records if r["ledger_id"] == live.ledger_id)["fragments"][0]
        assert lost.node_id in open_fragment["ensemble"] and open_fragment["lost"] == [lost.node_id]

        # --repair with only the protected ledger's password: that one is repaired, the others are reported, each
        # outcome printed before the next ledger's repair starts (an auditor stopped mid-round has logged its work).
        printed = []   # lines printed when each ledger's repair starts
        repair_ledger = Rereplicator.repair_ledger

        def watched(self, ledger_id, lost):
            printed.append(sys.stdout.getvalue().count("\n"))
            return repair_ledger(self, ledger_id, lost)

        monkeypatch.setattr(Rereplicator, "repair_ledger", watched)
        assert main(["audit", "--repair", "--password", "pw", "--metadata", metadata_uri]) == 1
        monkeypatch.setattr(Rereplicator, "repair_ledger", repair_ledger)
        assert len(printed) == 4 and all(a < b for a, b in zip(printed, printed[1:])), printed
        repaired = capsys.readouterr().out
        assert f"ledger {protected}: moved 1 fragment(s)" in repaired
        assert "repaired 1 of 4 under-replicated ledger(s)" in repaired
        assert "none of the given passwords is this ledger's" in repaired

        # The auditor, a separate process, repairs the rest on its own (recovering the OPEN ledger first), and logs
        # each repair as it is made.
        log = tmp_path / "auditor.log"
        with open(log, "w") as out:
            auditor = subprocess.Popen(
                [sys.executable, "-m", "connector", "audit", "--watch", "0.5", "--metadata", metadata_uri],
                stdout=out, stderr=subprocess.STDOUT, text=True)
            try:
                poll_until(lambda: main(["audit", "--metadata", metadata_uri]) == 0, 60,
                           what="the auditor to re-replicate every ledger")
                poll_until(lambda: f"ledger {live.ledger_id}: moved 1 fragment(s)" in log.read_text(), 30,
                           what="the auditor to log its repair of the OPEN ledger")
            finally:
                auditor.terminate()
                auditor.wait(timeout=20)
        assert "recovered and closed first" in log.read_text()
        assert main(["audit", "--watch", "1", "--once", "--metadata", metadata_uri]) == 0  # one auditor round
        assert "no under-replicated ledgers" in capsys.readouterr().out
        for ledger_id in expected:
            meta = client.ledger_metadata(ledger_id)
            assert meta.is_closed and lost.node_id not in meta.all_nodes()

        second = originals[1]
        second.kill()
        shutil.rmtree(second.data_dir)
        assert_every_entry_reads_back(client, expected)
