"""A node marked decommissioned is never named by a write of nodes chosen before the mark (registry.Placement):
a re-replication's CAS, a writer's ensemble change and a ledger's creation are each planned on a node list read
earlier, and a decommission that finds no ledger naming the node reports it drained (its data may then go).
Audit 2026-11-29: each of them could name the node after the decommission had reported it drained."""
import asyncio
import threading

from connector.client import LedgerClient, rereplicate
from connector.client.rereplicate import Rereplicator
from connector.client.runner import AddPipeline, recover
from connector.client.runner import add as add_runner
from connector.client.runner import recovery as recovery_runner
from metadata import registry
from metadata.model import LedgerState
from tests.integration import test_client_races as races
from tests.harness.ledger_data import append_entries, assert_every_entry_reads_back
from tests.harness.poll import poll_until


def decommission(metadata_uri: str, node_id: str) -> bool:
    """`ledger decommission` as an operator runs it; whether it found the node drained."""
    with LedgerClient(metadata_uri) as other, Rereplicator(other) as operator:
        return all(o.ok for o in operator.decommission(node_id))


def test_a_repair_whose_replacement_was_decommissioned_during_its_copy_does_not_name_it(start_node, metadata_uri,
                                                                                        monkeypatch):
    a, _, _ = (start_node() for _ in range(3))
    with LedgerClient(metadata_uri) as client:
        with client.create_ledger(3, 3, 2) as writer:
            entries = append_entries(writer, 30, 1)
        spare = start_node()
        a.stop()
        poll_until(lambda: a.node_id not in registry.list_nodes(client.store), 30)
        copied, release = threading.Event(), threading.Event()
        real_update = rereplicate.update_ledger

        def cas_after_the_copy(*args, **kwargs):   # the copies are on the spare, the CAS not sent yet
            copied.set()
            assert release.wait(30)
            return real_update(*args, **kwargs)

        monkeypatch.setattr(rereplicate, "update_ledger", cas_after_the_copy)
        with Rereplicator(client) as auditor:
            repair = threading.Thread(target=lambda: auditor.repair(auditor.audit()))
            repair.start()
            assert copied.wait(30)
            monkeypatch.setattr(rereplicate, "update_ledger", real_update)
            assert decommission(metadata_uri, spare.node_id)      # nothing names the spare yet
            release.set()
            repair.join(30)
        meta = client.ledger_metadata(writer.ledger_id)
        assert spare.node_id not in meta.all_nodes(), f"decommissioned, then named: {meta.fragments}"
        assert_every_entry_reads_back(client, {writer.ledger_id: (b"", entries)})


def test_an_ensemble_change_planned_before_a_decommission_chooses_again(start_node, metadata_uri, monkeypatch):
    first, _, _ = (start_node() for _ in range(3))
    with LedgerClient(metadata_uri, timeout=3.0) as client:
        writer = client.create_ledger(3, 3, 2)
        before = append_entries(writer, 20, 1)
        start_node(), start_node()                                # two spares
        real_update, outcome = add_runner.update_ledger, {}

        def decommission_the_replacement_first(store, ledger_id, transform, current, **kwargs):
            if outcome:
                return real_update(store, ledger_id, transform, current, **kwargs)
            # The replacement is chosen (the transform's choice is random: this one is kept); a decommission of
            # it runs before the CAS is sent.
            planned = transform(current.value)
            outcome["victim"], = set(planned.last_fragment.ensemble) - set(current.value.all_nodes())
            outcome["drained"] = decommission(metadata_uri, outcome["victim"])
            return real_update(store, ledger_id, lambda meta: planned if meta == current.value else transform(meta),
                               current, **kwargs)

        monkeypatch.setattr(add_runner, "update_ledger", decommission_the_replacement_first)
        first.kill()
        after = append_entries(writer, 20, 2)                    # the change happens under these appends
        writer.close()
        meta = client.ledger_metadata(writer.ledger_id)
        assert outcome["drained"] and outcome["victim"] not in meta.all_nodes(), meta.fragments
        assert first.node_id not in meta.last_fragment.ensemble
        entries = {**before, **{20 + i: p for i, p in enumerate(after.values())}}
        assert_every_entry_reads_back(client, {writer.ledger_id: (b"", entries)})


def test_a_ledger_created_on_nodes_chosen_before_a_decommission_chooses_again(start_node, metadata_uri):
    for _ in range(4):
        start_node()
    with LedgerClient(metadata_uri, timeout=3.0) as client:
        real_create, marked = client.store.create_ledger, []

        def mark_a_chosen_node_first(meta, *args):
            if not marked:
                marked.append(meta.fragments[0].ensemble[0])
                registry.mark_decommissioned(client.store, marked[0])
            return real_create(meta, *args)

        client.store.create_ledger = mark_a_chosen_node_first
        with client.create_ledger(3, 3, 2) as writer:
            assert writer.append(b"first") == 0
        assert marked and marked[0] not in client.ledger_metadata(writer.ledger_id).all_nodes()



def test_a_recovery_whose_write_back_chose_a_node_decommissioned_since_starts_over(store, monkeypatch):
    """A scripted network (the race needs a write-back that must replace a node): the recovery's write-back
    replaces b (rule 12, in memory); the replacement is decommissioned before the close stores it."""
    current, transport, ctx, _ = races.setup(store, ["a", "b", "c", "d", "e"], ["a", "b", "c"])
    ledger_id = current.value.ledger_id
    real_update, victims = recovery_runner.update_ledger, []

    def decommission_the_replacement_first(store, ledger_id, transform, current, **kwargs):
        if not victims and current.value.state is LedgerState.IN_RECOVERY:     # the close
            victims.extend(set(transform(current.value).all_nodes()) - set(current.value.all_nodes()))
            registry.mark_decommissioned(store, victims[0])
        return real_update(store, ledger_id, transform, current, **kwargs)

    async def scenario():
        writer = AddPipeline(ctx, current, races.KEY)
        await races.append_all(writer, [b"e%d" % i for i in range(5)])
        transport.hold_adds(lambda node, entry: node == "c" and entry.entry_id == 5)
        assert await races.append_all(writer, [b"e5"]) == [5]  # acknowledged by a and b; c never gets it
        writer.stop()                                           # the writer dies
        transport.discard()
        transport.fail_adds(lambda node, entry, recovery: recovery and node == "b")
        monkeypatch.setattr(recovery_runner, "update_ledger", decommission_the_replacement_first)
        return await recover(ctx, store.read_ledger(ledger_id), races.KEY)

    closed = asyncio.run(scenario())
    assert len(victims) == 1 and victims[0] in ("d", "e")
    assert (closed.value.state, closed.value.last_entry_id) == (LedgerState.CLOSED, 5)
    assert victims[0] not in closed.value.all_nodes(), closed.value.fragments
