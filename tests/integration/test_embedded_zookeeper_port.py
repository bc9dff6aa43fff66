"""The embedded ZooKeeper and a taken client port. A port it chose itself is free when chosen, not when the JVM
binds it a second or more later (any process's outgoing connection may take it in between; seen in CI as
"ZooKeeper exited with code 1" at a test's set-up): it moves to another free port. A port the caller gave is
kept, as is the port of a server that started before (its clients were given it), and the error names it."""
from __future__ import annotations

import socket

import pytest

import metadata.embedded as embedded
from metadata.embedded import EmbeddedZooKeeper, four_letter_word
from metadata.errors import ZooKeeperPortTakenError


@pytest.fixture
def taken_port():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_chosen_port_taken_before_zookeeper_binds_it_moves_to_another(tmp_path, monkeypatch, taken_port):
    choices = iter([taken_port])
    real_free_port = embedded.free_port
    monkeypatch.setattr(embedded, "free_port", lambda host="127.0.0.1": next(choices, None) or real_free_port(host))
    zookeeper = EmbeddedZooKeeper(tmp_path / "zookeeper")
    assert zookeeper.port == taken_port  # what free_port() handed out, taken before the JVM came up
    try:
        zookeeper.start()
        assert zookeeper.port != taken_port
        assert four_letter_word(zookeeper.host, zookeeper.port) == b"imok"
        assert zookeeper.uri().startswith(f"zk://127.0.0.1:{zookeeper.port}/")
    finally:
        zookeeper.kill()


def test_a_given_port_that_is_taken_fails_naming_the_port(tmp_path, taken_port):
    zookeeper = EmbeddedZooKeeper(tmp_path / "zookeeper", port=taken_port)
    with pytest.raises(ZooKeeperPortTakenError, match=f"127.0.0.1:{taken_port}: another process holds that port"):
        zookeeper.start()
    assert zookeeper.port == taken_port
    assert zookeeper.process.poll() is not None


def test_a_server_started_before_keeps_its_port_when_started_again(tmp_path):
    """Its clients were given that port (a test's outage, say): a restart must not move it elsewhere silently."""
    zookeeper = EmbeddedZooKeeper(tmp_path / "zookeeper").start()
    port = zookeeper.port
    zookeeper.kill()
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # past the stopped server's TIME_WAIT
        holder.bind(("127.0.0.1", port))
        holder.listen()
        with pytest.raises(ZooKeeperPortTakenError, match=f"127.0.0.1:{port}: another process holds that port"):
            zookeeper.start()
    assert zookeeper.port == port


def test_another_zookeeper_on_the_chosen_port_is_not_taken_for_this_one(tmp_path, monkeypatch):
    """Another ZooKeeper (another test's or cluster's) holds the port: it answers `imok` too, but this server failed
    to bind; before, start() returned as soon as the other one answered, and clients used the wrong server."""
    other = EmbeddedZooKeeper(tmp_path / "other").start()
    try:
        choices = iter([other.port])
        real_free_port = embedded.free_port
        monkeypatch.setattr(embedded, "free_port", lambda host="127.0.0.1": next(choices, None) or real_free_port(host))
        zookeeper = EmbeddedZooKeeper(tmp_path / "zookeeper")
        assert zookeeper.port == other.port
        try:
            zookeeper.start()
            assert zookeeper.port != other.port and zookeeper.process.poll() is None
        finally:
            zookeeper.kill()
    finally:
        other.kill()
