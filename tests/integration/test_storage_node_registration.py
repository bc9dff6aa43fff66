"""Registration in ZooKeeper: ephemeral, re-created after a session expiry, removed on clean shutdown."""
from __future__ import annotations

import pytest

from metadata import layout, serde
from metadata.model import NodeState
from protos import ledger_pb2 as pb
from tests.harness.node_client import NodeClient, make_entry
from tests.harness.poll import poll_until

# Driven with fixed ledger ids that have no metadata: the nodes bind master keys unchecked
# (--bind-keys-unchecked; the check itself: tests/security/test_ledger_claims.py).
pytestmark = pytest.mark.keys_unchecked


def registration(store, node):
    found = store.read(layout.node_path(node.node_id), serde.decode_node)
    return found.value if found is not None else None


def test_node_re_registers_after_its_zookeeper_session_expires(start_node, store):
    node = start_node(None, "--zk-session-timeout", "2")
    first = registration(store, node)
    assert (first.address, first.state, first.pid) == (node.address, NodeState.AVAILABLE, node.pid)
    node.pause()
    try:
        poll_until(lambda: registration(store, node) is None, 60, what="the paused node's session to expire")
    finally:
        node.resume()
    again = poll_until(lambda: registration(store, node), 60, what="the node to re-register")
    assert again.address == node.address and again.state is NodeState.AVAILABLE
    with NodeClient(node.address) as client:
        assert client.add(make_entry(1, 0, b"after the pause"))[0].status == pb.OK


def test_sigterm_checkpoints_deregisters_and_exits_zero(start_node, store):
    node = start_node()
    with NodeClient(node.address) as client:
        assert client.add(make_entry(1, 0, b"kept"))[0].status == pb.OK
    assert registration(store, node) is not None
    assert node.stop() == 0
    assert registration(store, node) is None
    assert (node.data_dir / "snapshot").exists()
    node.start()
    with NodeClient(node.address) as client:
        assert client.read(1, 0).payload == b"kept"
