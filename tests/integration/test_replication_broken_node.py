"""A node whose journal broke serves nothing until restarted, but stays registered (READ_ONLY, health broken): the
auditor counts its copies lost and makes them again elsewhere (auditor audit 2026-11-29: it never counted it lost,
so the fragments on it stayed one copy short for as long as it stayed broken)."""
from connector.client import LedgerClient
from connector.client.rereplicate import Rereplicator
from metadata import registry
from protos import ledger_pb2 as pb
from protos.digest import master_key
from storage_node.journal import FSYNC_FAULT_ENV
from tests.harness.ledger_data import append_entries, assert_every_entry_reads_back
from tests.harness.node_client import NodeClient, make_entry, payload_for
from tests.harness.poll import poll_until

FAULT = "fail-fsync"


def test_a_broken_nodes_copies_are_audited_lost_and_made_again(start_node, metadata_uri, monkeypatch):
    monkeypatch.setenv(FSYNC_FAULT_ENV, FAULT)
    nodes = [start_node() for _ in range(3)]
    with LedgerClient(metadata_uri) as client:
        with client.create_ledger(3, 3, 2) as writer:
            entries = append_entries(writer, 20, 1)
            ledger_id = writer.ledger_id
        start_node()
        victim = nodes[0]
        (victim.data_dir / FAULT).touch()
        with NodeClient(victim.address) as raw:
            # An add to a ledger it holds, with that ledger's key: journaled, and its fsync fails.
            late = make_entry(ledger_id, 20, payload_for(ledger_id, 20), key=master_key(b""))
            assert raw.add(late)[0].status != pb.OK
            assert raw.read(ledger_id, 0).status != pb.OK      # it serves nothing now
        poll_until(lambda: registry.list_nodes(client.store)[victim.node_id].broken, 15)
        with Rereplicator(client) as auditor:
            found = auditor.audit()
            assert [a.meta.ledger_id for a in found] == [ledger_id], (
                f"ledger {ledger_id} has a replica on broken {victim.node_id} (serves nothing), audit found {found}")
            assert found[0].reasons == {victim.node_id: "broken (it serves nothing until restarted)"}
            assert all(outcome.ok for outcome in auditor.repair(found))
        assert victim.node_id not in client.ledger_metadata(ledger_id).all_nodes()
        assert_every_entry_reads_back(client, {ledger_id: (b"", entries)})
