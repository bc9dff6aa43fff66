"""Rules 2 and 17: the nodes' LAC follows the writer's. A pipelined burst carries an old LAC on every entry,
so an idle writer sends its LAC explicitly, and again until every node of its ensemble has it."""
import time

from connector.client import LedgerClient
from connector.client.runner.add import IDLE_LAC_AFTER, LAC_RETRY_AFTER
from tests.harness.node_client import NodeClient
from tests.harness.poll import poll_until

TIMEOUT = 1.0


def node_lac(node, ledger_id: int) -> int:
    with NodeClient(node.address) as client:
        return client.read_lac(ledger_id).last_add_confirmed


def test_after_a_burst_and_a_pause_every_node_reports_the_writers_lac(cluster, metadata_uri):
    nodes = cluster(3)
    with LedgerClient(metadata_uri, timeout=TIMEOUT) as client:
        writer = client.create_ledger(3, 3, 2)
        frozen = next(n for n in nodes if n.node_id == writer.metadata.last_fragment.ensemble[-1])
        others = [n for n in nodes if n is not frozen]
        frozen.pause()  # a long GC pause: the burst and the first explicit LAC wait in its socket
        try:
            futures = [writer.append_async(b"x" * 100) for _ in range(300)]
            assert [f.result(timeout=30) for f in futures] == list(range(300))  # by the two others
            # every entry of the burst carried LAC -1 or a little more; the explicit LAC reaches the others
            poll_until(lambda: all(node_lac(n, writer.ledger_id) == 299 for n in others), timeout=10,
                       what="the explicit LAC on the running nodes")
            paused_at = time.monotonic()
            poll_until(lambda: time.monotonic() - paused_at > TIMEOUT + 0.5, timeout=10,
                       what="the explicit LAC to the paused node to time out")
        finally:
            frozen.resume()
        poll_until(lambda: node_lac(frozen, writer.ledger_id) == 299,
                   timeout=IDLE_LAC_AFTER + LAC_RETRY_AFTER + 2 * TIMEOUT + 1,
                   what="the paused node to hold the writer's LAC once it runs again")
        writer.close()


def test_a_tailing_readers_long_poll_answers_for_an_idle_writers_last_entry(cluster, metadata_uri):
    """The entry's own add carries the LAC before it (-1 here): with no next add, the idle writer's explicit LAC
    is what lets a tailing reader see it, over real nodes. When it is sent is checked on a virtual clock
    (tests/simulation/test_lac_publishing.py)."""
    nodes = cluster(3)
    with LedgerClient(metadata_uri, timeout=TIMEOUT) as client:
        writer = client.create_ledger(3, 3, 2)
        assert writer.append(b"only entry") == 0
        reader = client.open_ledger(writer.ledger_id, recover=False)
        assert reader.wait_lac(previous=-1, timeout=15) == 0
        assert [e.payload for e in reader.read(0, 0)] == [b"only entry"]
        poll_until(lambda: all(node_lac(n, writer.ledger_id) == 0 for n in nodes), timeout=10,
                   what="every node of the ensemble to hold the LAC")
        writer.close()
