"""A node that fails half-way through its start leaves nothing that breaks the next one (issue 15 item 7).

The trap seen on main: a node that could not bind its port had already created its cookie in ZooKeeper (and
in its directory); the local cluster's node of that id then met a ZooKeeper cookie without a directory
cookie and refused every later `ledger cluster start`. Now both ports are bound before anything is written,
the node registers only once it serves, a ZooKeeper cookie naming a directory that provably never served is
released, a node whose recorded port was taken moves, and whatever `cluster start` cannot repair it reports
in the node's own words.
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys

import pytest

from metadata import registry
from metadata.store import MetadataStore
from protos import ledger_pb2 as pb
from storage_node.cookie import check_cookie, read_disk_cookie
from tests.harness.node_client import PASSWORD, NodeClient, given_ledgers, make_entry
from tests.harness.node_process import NodeProcess


def ledger(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "connector.cli", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture
def local_cluster(tmp_path):
    """cluster_dir; `ledger cluster stop` at teardown whatever the test left running."""
    directory = tmp_path / "cluster"
    yield directory
    if (directory / "cluster.json").exists():
        ledger("cluster", "stop", "--dir", str(directory))


def start_cluster(directory, nodes):
    result = ledger("cluster", "start", "--dir", str(directory), "--nodes", str(nodes))
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def refused_start(directory, nodes):
    """`ledger cluster start` that fails: exit 1, one error line, no traceback; returns that line."""
    result = ledger("cluster", "start", "--dir", str(directory), "--nodes", str(nodes))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ledger: error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def registrations(uri):
    with MetadataStore(uri) as store:
        return registry.list_nodes(store)


def given_ledger(uri, ledger_id):
    """Metadata for a ledger id the test adds to on a node directly: a node binds only the key it names."""
    with MetadataStore(uri) as store:
        given_ledgers(store, {ledger_id: PASSWORD})


def zk_cookie(uri, node_id):
    with MetadataStore(uri) as store:
        found = registry.read_cookie(store, node_id)
    return found.value if found is not None else None


def holding_a_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


@pytest.mark.parametrize("option", ["--port", "--metrics-port"])
def test_a_node_that_cannot_listen_writes_nothing(tmp_path, store, start_node, option):
    data_dir = tmp_path / "node-1"
    with holding_a_port() as taken:
        port = str(taken.getsockname()[1])
        node = start_node("node-1", option, port, data_dir=data_dir, expect_failure=True)
    output = node.log()
    assert node.process.returncode != 0 and "Traceback" not in output, output
    assert f"127.0.0.1:{port}" in output and "refuses to start" in output, output
    assert registry.read_cookie(store, "node-1") is None, "the node created its cookie before it could listen"
    assert sorted(p.name for p in data_dir.iterdir()) == ["LOCK"]
    start_node("node-1", data_dir=data_dir)   # and the same node starts once it can listen


def test_the_issues_trap_a_node_started_on_a_taken_port_then_the_cluster(local_cluster, tmp_path):
    """As the issue describes it: `ledger node` on a port that is taken (here the port of node-1 of a running
    local cluster) for the id the cluster's next node will have, then `ledger cluster start --nodes 3`."""
    uri = start_cluster(local_cluster, 2).stdout.strip()
    taken = registrations(uri)["node-1"].address.rsplit(":", 1)[1]
    failed = ledger("node", "--data-dir", str(tmp_path / "by-hand"), "--port", taken, "--metadata", uri,
                    "--node-id", "node-3", timeout=60)
    assert failed.returncode != 0 and "cannot listen" in failed.stderr, failed.stderr
    assert zk_cookie(uri, "node-3") is None

    start_cluster(local_cluster, 3)
    node = registrations(uri)["node-3"]
    given_ledger(uri, 1)
    with NodeClient(node.address) as client:
        assert client.add(make_entry(1, 0, b"served"))[0].status == pb.OK
    assert zk_cookie(uri, "node-3").data_dir == str(local_cluster / "nodes" / "node-3")


def test_cluster_start_recovers_from_a_cookie_that_a_half_started_node_left(local_cluster, tmp_path):
    """The state the old order left behind (cookies in ZooKeeper and in a directory that never served, made
    here by the very cookie check that node ran before it failed to bind): the cluster's node-3 starts, the
    stale cookie is released, and the half-started directory can no longer start as node-3."""
    uri = start_cluster(local_cluster, 2).stdout.strip()
    by_hand = tmp_path / "by-hand"
    with MetadataStore(uri) as store:
        stale = check_cookie(store, by_hand, "node-3")
    assert zk_cookie(uri, "node-3") == stale
    files = sorted(p.relative_to(by_hand).as_posix() for p in by_hand.rglob("*"))

    start_cluster(local_cluster, 3)
    assert "node-3" in registrations(uri)
    fresh = zk_cookie(uri, "node-3")
    assert fresh.instance_id != stale.instance_id and fresh.data_dir == str(local_cluster / "nodes" / "node-3")
    log = (local_cluster / "nodes" / "node-3.log").read_text()
    assert f"named {by_hand}, where that node never served" in log, log
    assert read_disk_cookie(by_hand) == stale
    assert sorted(p.relative_to(by_hand).as_posix() for p in by_hand.rglob("*")) == sorted(files + ["LOCK"])

    again = NodeProcess(uri, by_hand, "node-3").start(expect_failure=True)
    assert again.process.returncode != 0 and "refuses to start" in again.log(), again.log()
    assert registrations(uri)["node-3"].data_dir == str(local_cluster / "nodes" / "node-3")


def test_a_cookie_whose_directory_served_is_kept_and_the_refusal_names_it(local_cluster, tmp_path):
    """Not provably safe: node-3 served (acknowledged an add) from another directory. `cluster start` fails
    with the node's reason in one line, the cookie stays, and node-3 still serves from its own directory."""
    uri = start_cluster(local_cluster, 2).stdout.strip()
    elsewhere = NodeProcess(uri, tmp_path / "elsewhere", "node-3").start()
    given_ledger(uri, 7)
    try:
        with NodeClient(elsewhere.address) as client:
            assert client.add(make_entry(7, 0, b"acknowledged elsewhere"))[0].status == pb.OK
        assert elsewhere.stop() == 0
        cookie = zk_cookie(uri, "node-3")

        line = refused_start(local_cluster, 3)
        assert "node-3 exited" in line and "refuses to start" in line, line
        assert f"created in {tmp_path / 'elsewhere'}" in line and "holds its data" in line, line
        assert f"--data-dir {tmp_path / 'elsewhere'}" in line, line
        assert zk_cookie(uri, "node-3") == cookie

        elsewhere.start()
        with NodeClient(elsewhere.address) as client:
            assert client.read(7, 0).payload == b"acknowledged elsewhere"
    finally:
        elsewhere.kill()


def test_a_wiped_node_directory_is_refused_in_the_nodes_own_words(local_cluster):
    """The cookie names the cluster's own directory, which was emptied: nothing proves the node never served,
    so `cluster start` says what the node says instead of only pointing at its log."""
    uri = start_cluster(local_cluster, 2).stdout.strip()
    given_ledger(uri, 3)
    with NodeClient(registrations(uri)["node-2"].address) as client:
        assert client.add(make_entry(3, 0, b"on node-2"))[0].status == pb.OK
    assert ledger("cluster", "stop", "--dir", str(local_cluster)).returncode == 0
    shutil.rmtree(local_cluster / "nodes" / "node-2")
    (local_cluster / "nodes" / "node-2").mkdir()

    line = refused_start(local_cluster, 2)
    assert "node-2 exited" in line and "has no cookie but ZooKeeper has a cookie for node node-2" in line, line
    assert "wiped or swapped" in line and str(local_cluster / "nodes" / "node-2.log") in line, line


def test_a_node_whose_recorded_port_was_taken_moves_to_a_free_one(local_cluster):
    uri = start_cluster(local_cluster, 2).stdout.strip()
    given_ledger(uri, 5)
    with NodeClient(registrations(uri)["node-1"].address) as client:
        assert client.add(make_entry(5, 0, b"kept"))[0].status == pb.OK
    assert ledger("cluster", "stop", "--dir", str(local_cluster)).returncode == 0
    recorded = {n["node_id"]: n["port"] for n in json.loads((local_cluster / "cluster.json").read_text())["nodes"]}

    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", recorded["node-1"]))
        taken.listen()
        result = start_cluster(local_cluster, 2)
    assert f"node-1: port {recorded['node-1']} is taken by another process; moved to port" in result.stderr
    nodes = registrations(uri)
    assert nodes["node-2"].address == f"127.0.0.1:{recorded['node-2']}"
    assert nodes["node-1"].address != f"127.0.0.1:{recorded['node-1']}"
    with NodeClient(nodes["node-1"].address) as client:
        assert client.read(5, 0).payload == b"kept"
