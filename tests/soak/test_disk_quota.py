"""--disk-quota-bytes: a node sharing its disk with others goes read-only when its own data directory reaches
its share (rule 9), and writable again once it is below; the soak's nemesis fills a disk this way."""
from __future__ import annotations

import os

import pytest

from metadata import registry
from metadata.model import NodeState
from protos import ledger_pb2 as pb
from tests.harness.node_client import NodeClient, make_entry
from tests.harness.poll import poll_until

# Driven with fixed ledger ids that have no metadata: the nodes bind master keys unchecked
# (--bind-keys-unchecked; the check itself: tests/security/test_ledger_claims.py).
pytestmark = pytest.mark.keys_unchecked

QUOTA = 64 << 20


def test_a_node_over_its_disk_quota_is_read_only_until_space_is_freed(start_node, store):
    node = start_node(None, "--disk-quota-bytes", str(QUOTA), "--disk-check-interval", "0.2")
    filler = node.data_dir / "filler"
    with NodeClient(node.address) as client:
        assert client.add(make_entry(1, 0, b"before"))[0].status == pb.OK
        with open(filler, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, QUOTA)
        poll_until(lambda: client.add(make_entry(1, 1, b"full"))[0].status == pb.READ_ONLY, 10,
                   what="the node to turn read-only")
        assert "--disk-quota-bytes" in client.node_info().read_only_reason
        # The registration follows the node's state a moment later (its registration writer): polled, not read once.
        poll_until(lambda: registry.list_nodes(store)[node.node_id].state is NodeState.READ_ONLY, 10,
                   what="the registration to say read_only")
        assert client.read(1, 0).payload == b"before"
        filler.unlink()
        poll_until(lambda: client.add(make_entry(1, 1, b"freed"))[0].status == pb.OK, 10,
                   what="the node to take adds again")
    poll_until(lambda: registry.list_nodes(store)[node.node_id].state is NodeState.AVAILABLE, 10,
               what="the registration to say available")
