"""`ledger cluster stop|status` act on the cluster's own processes only. cluster.json records pids, and after a
reboot such a pid may be any other process's: an audit's `cluster stop` killed an unrelated `sleep` that had the
pid of a node, and `cluster status` counted it as the node running."""
import dataclasses
import json
import signal
import subprocess
import sys

import pytest

from connector import cli
from connector.cluster import ClusterState, NodeSpec
from metadata.embedded import MAIN_CLASS, free_port
from tests.harness.poll import poll_until

PAUSE = "import signal; signal.pause()"


@pytest.fixture
def processes():
    """spawn(*argv) -> a process that waits for a signal; every one killed at teardown."""
    started = []

    def spawn(*argv: str) -> subprocess.Popen:
        started.append(subprocess.Popen(argv))
        return started[-1]

    yield spawn
    for process in started:
        process.kill()
        process.wait()


def record(directory, zk_pid: int, node_pid: int) -> None:
    state = ClusterState(zk_port=free_port(), zk_pid=zk_pid, nodes=[NodeSpec("node-1", free_port(), node_pid)])
    (directory / "cluster.json").write_text(json.dumps(dataclasses.asdict(state)))


def test_stop_leaves_alone_processes_that_have_the_recorded_pids_since(tmp_path, processes):
    stranger = processes("sleep", "300")
    record(tmp_path, zk_pid=stranger.pid, node_pid=stranger.pid)
    assert cli.main(["cluster", "stop", "--dir", str(tmp_path)]) == 0
    assert stranger.poll() is None, f"cluster stop signalled an unrelated process (status {stranger.returncode})"
    state = json.loads((tmp_path / "cluster.json").read_text())
    assert state["zk_pid"] == 0 and state["nodes"][0]["pid"] == 0


def test_status_does_not_count_another_process_as_the_node(tmp_path, processes, capsys):
    stranger = processes("sleep", "300")
    record(tmp_path, zk_pid=stranger.pid, node_pid=stranger.pid)
    assert cli.main(["cluster", "status", "--dir", str(tmp_path), "--json"]) == 1
    status = json.loads(capsys.readouterr().out)
    assert status["zookeeper"] is False and status["nodes"][0]["running"] is False


def test_stop_still_stops_the_clusters_own_node_and_zookeeper(tmp_path, processes):
    """Processes whose arguments are those of the cluster's node (`-m storage_node --data-dir DIR/nodes/node-1`)
    and ZooKeeper (QuorumPeerMain DIR/zookeeper/zoo.cfg) are the cluster's: stop ends them."""
    node = processes(sys.executable, "-c", PAUSE, "-m", "storage_node", "--data-dir", str(tmp_path / "nodes/node-1"))
    zookeeper = processes(sys.executable, "-c", PAUSE, MAIN_CLASS, str(tmp_path / "zookeeper" / "zoo.cfg"))
    other_node = processes(sys.executable, "-c", PAUSE, "-m", "storage_node", "--data-dir", str(tmp_path / "other"))
    poll_until(lambda: all(_arguments_set(p.pid) for p in (node, zookeeper, other_node)), timeout=10)
    record(tmp_path, zk_pid=zookeeper.pid, node_pid=node.pid)
    assert cli.main(["cluster", "stop", "--dir", str(tmp_path)]) == 0
    assert node.wait(10) == -signal.SIGTERM and zookeeper.wait(10) == -signal.SIGTERM
    record(tmp_path, zk_pid=0, node_pid=other_node.pid)   # another directory's node
    assert cli.main(["cluster", "stop", "--dir", str(tmp_path)]) == 0
    assert other_node.poll() is None


def _arguments_set(pid: int) -> bool:
    """The process runs Python with its arguments (not the moment between fork and exec)."""
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return b"signal.pause" in cmdline.read()
