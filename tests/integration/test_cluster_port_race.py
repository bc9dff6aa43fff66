"""A node (or a new cluster's ZooKeeper) whose port another process takes while it starts is moved to another port
and started again.

A port is free when the cluster picks it (and checks it again just before the start), not when the node binds it
about a second later, after its imports: in a CI run with four test workers starting clusters, another process
took one in between, and `ledger cluster start` failed. Here a real listening socket takes node-1's port just
before its first launch (the race the other process won); the node really fails to bind and really exits.
"""
from __future__ import annotations

import errno
import socket

import pytest

from connector.cluster import LocalCluster
from metadata.embedded import EmbeddedZooKeeper, listens
from metadata.errors import ZooKeeperPortTakenError
from tests.harness.poll import poll_until


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


class _ZooKeeperPortThief(LocalCluster):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.thief: socket.socket | None = None
        self.stolen: int | None = None

    def start_zookeeper(self, *args, **kwargs):
        if self.stolen is None:
            # Another process may hold the port for a moment (seen in CI, twice): had the thief given up then, the port
            # could be free again when ZooKeeper binds it. It keeps trying for a while; a process that holds the
            # port all that time takes it all the same.
            try:
                self.thief = poll_until(lambda: _bound(self.state.zk_port), 10, what="the thief to take the port")
            except AssertionError:
                self.thief = None
            self.stolen = self.state.zk_port
        return super().start_zookeeper(*args, **kwargs)


def _bound(port: int) -> socket.socket | None:
    """A listening socket on the port, or None while another process holds it."""
    thief = socket.socket()
    thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past a stopped ZooKeeper's TIME_WAIT
    try:
        thief.bind(("127.0.0.1", port))
        thief.listen()
    except OSError as exc:
        thief.close()
        if exc.errno != errno.EADDRINUSE:
            raise
        return None
    return thief


def test_a_new_cluster_whose_zookeeper_port_is_taken_moves_zookeeper_and_starts(tmp_path):
    cluster = _ZooKeeperPortThief(tmp_path / "cluster", nodes=1)
    try:
        cluster.start(timeout=60)
        assert cluster.stolen is not None and cluster.state.zk_port != cluster.stolen
        assert cluster.notes == [
            f"zookeeper: port {cluster.stolen} is taken by another process; moved to port {cluster.state.zk_port}"]
        assert cluster.metadata_uri == f"zk://127.0.0.1:{cluster.state.zk_port}/ledgers"
        assert [(n["running"], n["registered"]) for n in cluster.status()["nodes"]] == [(True, True)]
        assert LocalCluster(tmp_path / "cluster").state.zk_port == cluster.state.zk_port   # recorded
    finally:
        cluster.stop()
        if cluster.thief is not None:
            cluster.thief.close()


def test_a_started_cluster_keeps_its_zookeeper_port_and_says_it_is_taken(tmp_path):
    """Clients were given the metadata URI with this port: moving it would strand them."""
    LocalCluster(tmp_path / "cluster", nodes=1).start(timeout=60)
    LocalCluster(tmp_path / "cluster").stop()
    cluster = _ZooKeeperPortThief(tmp_path / "cluster")
    try:
        with pytest.raises(ZooKeeperPortTakenError, match=f"127.0.0.1:{cluster.state.zk_port}: another process"):
            cluster.start(timeout=60)
        assert cluster.state.zk_port == cluster.stolen
    finally:
        cluster.stop()
        if cluster.thief is not None:
            cluster.thief.close()


class _ZooKeeperTakenByAnother(LocalCluster):
    """Another ZooKeeper (another test's or cluster's) takes the new cluster's port before it starts its own."""

    def __init__(self, *args, other_dir, **kwargs):
        super().__init__(*args, **kwargs)
        self.other_dir = other_dir
        self.other = None

    def start_zookeeper(self, *args, **kwargs):
        if self.other is None:
            self.other = EmbeddedZooKeeper(self.other_dir, port=self.state.zk_port).start()
        return super().start_zookeeper(*args, **kwargs)


def test_a_new_cluster_does_not_take_another_zookeeper_on_its_port_for_its_own(tmp_path):
    """Found by review: the cluster asked only `ruok` on its port, and another ZooKeeper answered `imok`; the
    cluster then initialised its root and registered its nodes there."""
    cluster = _ZooKeeperTakenByAnother(tmp_path / "cluster", nodes=1, other_dir=tmp_path / "other")
    try:
        cluster.start(timeout=60)
        assert cluster.state.zk_port != cluster.other.port
        assert listens(cluster.state.zk_pid, "127.0.0.1", cluster.state.zk_port)
        assert [(n["running"], n["registered"]) for n in cluster.status()["nodes"]] == [(True, True)]
    finally:
        cluster.stop()
        if cluster.other is not None:
            cluster.other.kill()
