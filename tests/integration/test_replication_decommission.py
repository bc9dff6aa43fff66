"""`ledger decommission` under data: the node's fragments move to the spare node (OPEN ledgers recovered first),
then the node is stopped and its directory deleted, and every entry of every ledger still reads back, even
after one more node is lost."""
import shutil

import pytest

from connector.cli import main
from connector.client import LedgerClient, LedgerClosedError, LedgerFencedError
from metadata import registry
from tests.harness.ledger_data import append_entries, assert_every_entry_reads_back
from tests.harness.node_client import NodeClient


def test_decommission_under_data_then_delete_the_nodes_directory(start_node, metadata_uri, capsys):
    originals = [start_node() for _ in range(3)]  # every ledger's ensemble is these three
    with LedgerClient(metadata_uri) as client:
        expected = {}
        for seed, (ensemble, write_quorum, password) in enumerate([(3, 2, b""), (3, 3, b""), (3, 2, b"secret")]):
            with client.create_ledger(ensemble, write_quorum, 2, password=password) as writer:
                expected[writer.ledger_id] = (password, append_entries(writer, 150, seed))
        open_writer = client.create_ledger(3, 2, 2)  # stays OPEN, its writer alive
        expected[open_writer.ledger_id] = (b"", append_entries(open_writer, 100, 99))
        full = next(i for i, (_, entries) in expected.items() if client.ledger_metadata(i).write_quorum == 3)
        spare = start_node()  # the only node a fragment can move to
        victim = originals[1]

        assert main(["decommission", "node-typo", "--metadata", metadata_uri]) == 1
        assert "node node-typo is unknown" in capsys.readouterr().err
        assert registry.decommissioned_nodes(client.store) == set()

        # Without the password of one ledger, the rest moves; that ledger stays on the node, and the command
        # says so instead of claiming success.
        assert main(["decommission", victim.node_id, "--metadata", metadata_uri]) == 1
        out = capsys.readouterr().out
        assert "none of the given passwords is this ledger's" in out
        assert f"node {victim.node_id} still holds fragments of 1 ledger(s)" in out
        # Marked at once: new ledgers and replacements avoid it while it drains.
        for _ in range(5):
            with client.create_ledger(3, 3, 2) as writer:
                assert victim.node_id not in writer.metadata.all_nodes()

        assert main(["decommission", victim.node_id, "--metadata", metadata_uri,
                     "--password", "", "--password", "secret"]) == 0
        assert f"node {victim.node_id} is decommissioned: no ledger uses it" in capsys.readouterr().out

        victim.stop()
        shutil.rmtree(victim.data_dir)
        for ledger_id in client.list_ledgers():
            assert victim.node_id not in client.ledger_metadata(ledger_id).all_nodes()
        assert registry.decommissioned_nodes(client.store) == {victim.node_id}
        assert_every_entry_reads_back(client, expected)

        # Copies are the writer's entries as sent: same payload, piggybacked LAC and digest as a survivor's.
        with NodeClient(spare.address) as copy, NodeClient(originals[0].address) as survivor:
            for entry_id in expected[full][1]:
                copied, original = copy.read(full, entry_id), survivor.read(full, entry_id)
                assert (copied.payload, copied.last_add_confirmed, copied.digest) == (
                    original.payload, original.last_add_confirmed, original.digest)

        # The OPEN ledger was recovered (fenced and closed) before its fragment moved.
        with pytest.raises((LedgerFencedError, LedgerClosedError)):
            open_writer.append(b"after the decommission")
        assert main(["audit", "--metadata", metadata_uri]) == 0
        assert "no under-replicated ledgers" in capsys.readouterr().out

        # Every entry has its full write quorum again: losing one more original node loses nothing.
        originals[0].kill()
        shutil.rmtree(originals[0].data_dir)
        assert_every_entry_reads_back(client, expected)
