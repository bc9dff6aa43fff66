"""Rule 3 under load: SIGKILL a node of the ensemble mid-stream; writes go on, every acked entry reads back,
the metadata shows the new fragment."""
from connector.client import LedgerClient
from metadata.model import LedgerState
from tests.harness.background_writer import BackgroundWriter
from tests.harness.poll import poll_until


def test_killing_a_node_mid_stream_changes_the_ensemble_and_loses_nothing(cluster, metadata_uri):
    nodes = {n.node_id: n for n in cluster(4)}
    with LedgerClient(metadata_uri) as client:
        w = client.create_ledger(3, 3, 2)
        victim = w.metadata.last_fragment.ensemble[1]
        background = BackgroundWriter(w)
        poll_until(lambda: len(background.acked) >= 500, 30, what="500 acknowledged adds")
        acked_before_kill = len(background.acked)
        nodes[victim].kill()
        acked_at_kill = len(background.acked)  # the change may be done already: kill() waits for the exit
        poll_until(lambda: len(background.acked) >= acked_at_kill + 1000, 60,
                   what="1000 more acknowledged adds after the kill")
        background.stop()
        assert background.error is None
        meta = w.close()
        assert meta.state is LedgerState.CLOSED and meta.last_entry_id == max(background.acked)
        assert len(meta.fragments) == 2
        first, second = meta.fragments
        assert victim in first.ensemble and victim not in second.ensemble
        assert set(second.ensemble) == set(nodes) - {victim}
        assert acked_before_kill <= second.first_entry_id <= acked_at_kill + 200  # LAC+1 when the node failed
        stored = {e.entry_id: e.payload for e in client.open_ledger(w.ledger_id).read(0, meta.last_entry_id)}
        assert stored == background.acked


def test_a_reader_opened_before_two_ensemble_changes_reads_what_the_new_nodes_hold(cluster, metadata_uri):
    """Helper audit 2026-11-29 finding 2: a handle kept for tailing (open_ledger(recover=False), wait_lac) planned
    its reads with the fragments it opened with: once the writer had replaced both nodes of some entries' write set,
    read() failed ("could not be read from any replica") although the new nodes held them. It now reads the metadata
    again when no replica it knows of can serve an entry."""
    nodes = {n.node_id: n for n in cluster(5)}
    with LedgerClient(metadata_uri) as client, LedgerClient(metadata_uri) as reader_client:
        w = client.create_ledger(3, 2, 2)
        payloads = {i: b"entry-%d" % i for i in range(30)}
        for i in range(10):
            w.append(payloads[i])
        reader = reader_client.open_ledger(w.ledger_id, recover=False)
        first, second, _ = w.metadata.last_fragment.ensemble
        for victim, batch in ((first, range(10, 20)), (second, range(20, 30))):
            nodes[victim].kill()
            for i in batch:
                w.append(payloads[i])
        assert len(w.metadata.fragments) == 3
        lac = reader.wait_lac(previous=9, timeout=10)
        assert lac > 9
        # (entries 0..9 whose write set was both victims are gone with them: nothing was re-replicated)
        assert {e.entry_id: e.payload for e in reader.read(10, lac)} == {i: payloads[i] for i in range(10, lac + 1)}
        assert len(reader.metadata.fragments) == 3
        w.close()
