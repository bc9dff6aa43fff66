"""A storage node stops on SIGTERM while ZooKeeper is unreachable: its shutdown does not wait for ZooKeeper
(deregistering blocked in kazoo until ZooKeeper came back, so `ledger cluster stop` and service managers had
to SIGKILL it; found by `ledger soak`). The ephemeral registration ends with the session anyway."""
from __future__ import annotations

import subprocess

from metadata.embedded import EmbeddedZooKeeper
from metadata.store import initialise_root
from tests.harness.node_process import NodeProcess
from tests.harness.poll import poll_until


def test_a_node_stops_on_sigterm_while_zookeeper_is_down(tmp_path):
    zookeeper = EmbeddedZooKeeper(tmp_path / "zookeeper").start()  # its own: this test takes it down
    initialise_root(zookeeper.uri())
    node = NodeProcess(zookeeper.uri(), tmp_path / "node", "lonely")
    try:
        node.start()
        zookeeper.kill()
        # The node's own line, logged once its session is suspended (kazoo's "Connection dropped" comes before
        # that: a SIGTERM in between found the session still connected and said nothing).
        poll_until(lambda: "ZooKeeper connection lost" in node.log(), 30, what="the node to lose ZooKeeper")
        node.process.terminate()
        try:
            node.process.wait(20)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the node did not stop within 20 s of SIGTERM: {node.log()[-2000:]}") from None
        # It said why it stopped without deregistering (read by a thread that may lag the exit a little).
        poll_until(lambda: "did not finish" in node.log(), 10, what="the node to say it did not deregister")
    finally:
        node.kill()
        zookeeper.kill()
