"""`ledger node readonly NODE [--off]` against a real node: the safe drain path of seed 002."""
from __future__ import annotations

import subprocess
import sys

import pytest

from metadata import registry
from metadata.model import NodeState
from protos import ledger_pb2 as pb
from tests.harness.node_client import NodeClient, make_entry
from tests.harness.poll import poll_until

# Driven with fixed ledger ids that have no metadata: the nodes bind master keys unchecked
# (--bind-keys-unchecked; the check itself: tests/security/test_ledger_claims.py).
pytestmark = pytest.mark.keys_unchecked


def ledger_cli(metadata_uri: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "connector.cli", "node", "readonly", *args, "--metadata", metadata_uri],
                          capture_output=True, text=True, timeout=60)


def add_status(client: NodeClient, entry_id: int, recovery: bool = False) -> int:
    return client.add(make_entry(5, entry_id, b"x", recovery=recovery))[0].status


def test_readonly_refuses_normal_adds_keeps_reads_survives_restart_and_off_restores(start_node, store, metadata_uri):
    node = start_node("drained")
    with NodeClient(node.address) as client:
        assert add_status(client, 0) == pb.OK

    done = ledger_cli(metadata_uri, node.node_id)
    assert done.returncode == 0, done.stderr
    assert "read_only" in done.stdout
    assert registry.list_nodes(store)[node.node_id].state is NodeState.READ_ONLY
    with NodeClient(node.address) as client:
        assert add_status(client, 1) == pb.READ_ONLY
        assert client.node_info().read_only
        assert client.read(5, 0).status == pb.OK
        assert add_status(client, 1, recovery=True) == pb.OK          # recovery write-back still lands

    node.restart()                                                       # SIGKILL, then start again
    with NodeClient(node.address) as client:
        assert add_status(client, 2) == pb.READ_ONLY                     # the flag applies before it serves
        assert client.read(5, 1).status == pb.OK

    done = ledger_cli(metadata_uri, node.node_id, "--off")
    assert done.returncode == 0, done.stderr
    assert "available" in done.stdout
    with NodeClient(node.address) as client:
        poll_until(lambda: add_status(client, 2) == pb.OK, timeout=10, what="adds to be accepted again")
        assert not client.node_info().read_only


def test_readonly_of_an_unknown_node_is_refused(store, metadata_uri):
    done = ledger_cli(metadata_uri, "no-such-node")
    assert done.returncode == 1
    assert "no storage node 'no-such-node'" in done.stderr
    assert not registry.readonly_requested(store, "no-such-node")


def test_a_read_only_node_takes_the_lac_of_a_ledger_it_holds_and_refuses_one_it_does_not(start_node, metadata_uri):
    """Rule 17: the LAC describes entries the node stores already, so a drained or full node still takes it."""
    node = start_node("drained")
    with NodeClient(node.address) as client:
        assert [add_status(client, e) for e in range(3)] == [pb.OK] * 3
        assert client.read_lac(5).last_add_confirmed == 1   # entry 2 carried LAC 1
    done = ledger_cli(metadata_uri, node.node_id)
    assert done.returncode == 0, done.stderr
    with NodeClient(node.address) as client:
        poll_until(lambda: client.node_info().read_only, timeout=10, what="the node to turn read-only")
        waiting = client.wait_lac_future(5, previous_lac=1, timeout_ms=10_000)
        assert client.write_lac(5, 2).status == pb.OK
        assert waiting.result(timeout=10).last_add_confirmed == 2   # a tailing reader wakes up
        assert client.read_lac(5).last_add_confirmed == 2
        assert client.write_lac(6, 0).status == pb.READ_ONLY        # nothing of ledger 6 here: no new state
