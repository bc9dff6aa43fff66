"""A node whose port another process takes while it starts is moved to another port and started again.

A port is free when the cluster picks it (and checks it again just before the start), not when the node binds it
about a second later, after its imports: in a CI run with four test workers starting clusters, another process
took one in between, and `ledger cluster start` failed. Here a real listening socket takes node-1's port just
before its first launch (the race the other process won); the node really fails to bind and really exits.
"""
from __future__ import annotations

import socket

from connector.cluster import LocalCluster


class _PortThief(LocalCluster):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.thief: socket.socket | None = None
        self.stolen: int | None = None

    def _start_node(self, spec):
        if self.thief is None and spec.node_id == "node-1":
            self.thief = socket.socket()
            self.thief.bind(("127.0.0.1", spec.port))
            self.thief.listen()
            self.stolen = spec.port
        return super()._start_node(spec)


def test_a_node_whose_port_is_taken_while_it_starts_moves_and_the_cluster_starts(tmp_path):
    cluster = _PortThief(tmp_path / "cluster", nodes=2)
    try:
        cluster.start(timeout=60)
        node = cluster.node("node-1")
        assert cluster.stolen is not None and node.port != cluster.stolen
        assert [note for note in cluster.notes if "was taken while it started" in note] == [
            f"node-1: port {cluster.stolen} was taken while it started; moved to port {node.port}"]
        status = cluster.status()
        assert [(n["node_id"], n["running"], n["registered"]) for n in status["nodes"]] == [
            ("node-1", True, True), ("node-2", True, True)]
        assert LocalCluster(tmp_path / "cluster").node("node-1").port == node.port   # recorded for the next start
    finally:
        cluster.stop()
        if cluster.thief is not None:
            cluster.thief.close()
