"""One node process per data directory (issue 15 item 7): a second `ledger node` on a running node's directory
is refused with one line naming the running process, and the running node is untouched; a node that exits never
removes a registration that is not its own.

The trap seen on main: the second process was accepted, wrote into the journal, replaced the running node's
registration with its own and removed it on exit, leaving the real node "not registered" until restarted.
"""
from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from metadata import layout, serde
from metadata.model import NodeRegistration, NodeState
from protos import ledger_pb2 as pb
from tests.harness.node_client import NodeClient, make_entry
from tests.harness.node_process import NodeProcess
from tests.harness.poll import poll_until

# Driven with fixed ledger ids that have no metadata: the nodes bind master keys unchecked
# (--bind-keys-unchecked; the check itself: tests/security/test_ledger_claims.py).
pytestmark = pytest.mark.keys_unchecked


def registration(store, node_id):
    found = store.read(layout.node_path(node_id), serde.decode_node)
    return found.value if found is not None else None


def files_of(directory):
    """Every file under directory with the digest of its bytes (LOCK, the lock's own notes, left out)."""
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*")) if path.is_file() and path.name != "LOCK"
    }


def second_node(metadata_uri, data_dir, node_id, *args):
    """`ledger node ...` on the given directory, as an operator would type it; the finished process."""
    command = [sys.executable, "-m", "connector.cli", "node", "--data-dir", str(data_dir), "--port", "0",
               "--metadata", metadata_uri, "--node-id", node_id, *args]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"a second node on {data_dir} was accepted and kept running: {exc.stdout!r}") from exc


def assert_refused(result, running):
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert str(running.pid) in lines[0] and running.node_id in lines[0] and running.address in lines[0], lines[0]
    assert "in use" in lines[0] and str(running.data_dir) in lines[0], lines[0]


def assert_untouched(store, running):
    """Still registered as itself, still serving what it acknowledged, still taking adds."""
    reg = registration(store, running.node_id)
    assert reg is not None, "the running node was deregistered"
    assert (reg.pid, reg.address, reg.state) == (running.pid, running.address, NodeState.AVAILABLE)
    assert running.process.poll() is None
    with NodeClient(running.address) as client:
        assert client.read(1, 0).payload == b"acknowledged before"
        assert client.add(make_entry(1, 1, b"still taking adds"))[0].status == pb.OK


def test_a_second_node_on_a_running_nodes_data_directory_is_refused_and_the_running_node_is_untouched(
        start_node, store, metadata_uri):
    running = start_node("node-1")
    with NodeClient(running.address) as client:
        assert client.add(make_entry(1, 0, b"acknowledged before"))[0].status == pb.OK
    before = files_of(running.data_dir)

    # The same node id (the operator's mistake), then another id on the same directory.
    for node_id in ("node-1", "node-9"):
        assert_refused(second_node(metadata_uri, running.data_dir, node_id), running)
        assert files_of(running.data_dir) == before, "the refused process wrote into the running node's directory"
        assert registration(store, "node-9") is None

    assert_untouched(store, running)


def test_a_paused_node_still_holds_its_data_directory(start_node, store, metadata_uri):
    """SIGSTOP (a long pause) must not let another process take the directory: the paused node comes back."""
    running = start_node("node-1", "--zk-session-timeout", "30")
    with NodeClient(running.address) as client:
        assert client.add(make_entry(1, 0, b"acknowledged before"))[0].status == pb.OK
    before = files_of(running.data_dir)
    running.pause()
    try:
        assert_refused(second_node(metadata_uri, running.data_dir, "node-1"), running)
    finally:
        running.resume()
    assert files_of(running.data_dir) == before
    assert_untouched(store, running)


def test_the_directory_is_free_again_once_its_node_is_gone(start_node, store):
    """The lock is the process's, not the file's: after SIGKILL (LOCK left behind) and after SIGTERM a new
    process on the directory starts, and its registration is its own."""
    node = start_node("node-1")
    with NodeClient(node.address) as client:
        assert client.add(make_entry(1, 0, b"kept"))[0].status == pb.OK
    node.kill()
    node.start()
    assert registration(store, "node-1").pid == node.pid
    assert node.stop() == 0
    node.start()
    assert registration(store, "node-1").pid == node.pid
    with NodeClient(node.address) as client:
        assert client.read(1, 0).payload == b"kept"


def test_a_node_that_exits_leaves_a_registration_that_is_not_its_own(start_node, store):
    """Defence in depth: the registration in the node's path now belongs to another process (another session);
    the exiting node must not delete it."""
    node = start_node("node-1")
    path = layout.node_path("node-1")
    assert store.delete(path)
    other = NodeRegistration("node-1", "127.0.0.1:1", NodeState.AVAILABLE, "/elsewhere", 4242, "")
    store.create(path, serde.encode_node(other), ephemeral=True)
    assert node.stop() == 0
    assert registration(store, "node-1") == other


def test_the_lock_file_names_the_running_node(start_node):
    node = start_node("node-1")
    text = poll_until(lambda: (node.data_dir / "LOCK").read_text(), 10, what="the lock file's notes")
    assert str(node.pid) in text and "node-1" in text and node.address in text


def test_a_node_process_on_a_directory_locked_by_a_stranger_is_refused(tmp_path, metadata_uri, store):
    """Any process holding the lock (here one that wrote nothing in it) keeps a node out, with a clear line."""
    data_dir = tmp_path / "node-1"
    data_dir.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('locked', flush=True); time.sleep(120)", str(data_dir / "LOCK")],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        node = NodeProcess(metadata_uri, data_dir, "node-1").start(expect_failure=True)
        output = node.log()
        assert node.process.returncode != 0 and "Traceback" not in output, output
        assert "in use" in output and str(data_dir) in output, output
        assert registration(store, "node-1") is None
        assert not (data_dir / "COOKIE").exists()
    finally:
        holder.kill()
        holder.wait(10)
