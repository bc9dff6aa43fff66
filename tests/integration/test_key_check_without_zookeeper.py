"""A node that cannot reach ZooKeeper when it first sees a ledger binds no key to it (storage_node/key_check.py):
a fence, WriteLac or add answers ERROR (unknown: a writer changes ensemble, a recovery counts the node as not
answering), nothing is bound or fenced, and once ZooKeeper is back the same requests go through, the ledger's key
checked. A ledger the node held before the outage takes adds throughout. A ZooKeeper of the test's own, stopped
for real (SIGKILL) and started again on its data."""
from __future__ import annotations

import pytest

from metadata.embedded import EmbeddedZooKeeper
from metadata.store import MetadataStore, initialise_root
from protos import ledger_pb2 as pb
from tests.harness.node_client import KEY, OTHER_KEY, PASSWORD, NodeClient, given_ledgers, make_entry
from tests.harness.node_process import NodeProcess
from tests.harness.poll import poll_until

ROOT = "/first-sight/ledgers"
HELD, NEW = 1, 2


@pytest.fixture
def zookeeper(tmp_path):
    server = EmbeddedZooKeeper(tmp_path / "zookeeper").start()
    yield server
    server.kill()


def first_sight_requests(client: NodeClient, ledger_id: int) -> dict[str, pb.Status]:
    """The status of a fence, a WriteLac and an add (entry 0) of a ledger, each of which would bind its key."""
    return {"fence": client.read_lac(ledger_id, fence=True, key=KEY).status,
            "write_lac": client.write_lac(ledger_id, -1).status,
            "add": client.add(make_entry(ledger_id, 0, b"first"))[0].status}


def test_a_ledger_first_seen_while_zookeeper_is_away_is_refused_as_unknown_and_bound_once_it_is_back(
        zookeeper, tmp_path):
    uri = zookeeper.uri(ROOT)
    initialise_root(uri)
    with MetadataStore(uri) as store:
        given_ledgers(store, {HELD: PASSWORD, NEW: PASSWORD})
    node = NodeProcess(uri, tmp_path / "node-1", "node-1", "--zk-session-timeout", "30").start()
    try:
        with NodeClient(node.address) as client:
            assert client.add(make_entry(HELD, 0, b"before"))[0].status == pb.OK

            zookeeper.kill()
            refused = first_sight_requests(client, NEW)
            assert refused == {"fence": pb.ERROR, "write_lac": pb.ERROR, "add": pb.ERROR}, refused
            message = client.read_lac(NEW, fence=True, key=KEY).message
            assert "cannot check the master key of ledger 2" in message and "binds no key unchecked" in message
            assert client.read_lac(NEW).status == pb.NO_LEDGER          # nothing bound, nothing fenced
            # The ledger it holds goes on without ZooKeeper.
            assert client.add(make_entry(HELD, 1, b"during"))[0].status == pb.OK

            zookeeper.start()
            # Back: a wrong key is refused for what it is, and the right one is bound.
            poll_until(lambda: client.write_lac(NEW, -1, key=OTHER_KEY).status == pb.UNAUTHORIZED, 60,
                       what="the node to check keys against ZooKeeper again")
            assert first_sight_requests(client, NEW) == {"fence": pb.OK, "write_lac": pb.FENCED, "add": pb.FENCED}
            assert client.read_lac(NEW).status == pb.OK
            assert [client.read(HELD, e).payload for e in (0, 1)] == [b"before", b"during"]
    finally:
        node.kill()
