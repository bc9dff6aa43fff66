"""How a storage node is started and what it says: the ready file it writes once it serves (--ready-file), the
launcher that waits for it (connector/node_launcher.py) and quotes a node that exits or is late in its own
words, and its log lines (--log-level, every line naming the node). Real node processes throughout."""
from __future__ import annotations

import json
import re
import socket
import subprocess

import pytest

from connector.cluster import node_info
from connector.node_launcher import NodeHandle, NodeStartError, launch, node_command, start_node
from metadata import registry
from metadata.embedded import free_port
from protos.ready_file import NodeReady, write_ready

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) node=(\S+) [\w.]+: ")


def test_the_ready_file_names_the_address_the_node_serves_and_registered(metadata_uri, store, tmp_path):
    port, metrics_port = free_port(), free_port()
    ready_file = tmp_path / "node-1.ready"
    node = start_node(node_command(tmp_path / "node-1", port, metadata_uri, "node-1", "--metrics-port",
                                   str(metrics_port)), "node-1", 60, ready_file=ready_file)
    try:
        written = json.loads(ready_file.read_text())
        assert written == {"node_id": "node-1", "address": f"127.0.0.1:{port}",
                           "metrics_address": f"127.0.0.1:{metrics_port}", "pid": node.pid}, written
        assert node.address == f"127.0.0.1:{port}" and node.ready.metrics_port == metrics_port
        assert registry.list_nodes(store)["node-1"].address == node.address   # registered before it said so
        assert "error" not in node_info(node.address)                          # and it answers there
        assert not ready_file.with_name("node-1.ready.tmp").exists()
    finally:
        status = node.stop()
    assert status == 0 and not ready_file.exists(), "a stopped node leaves no ready file behind"


def test_a_ready_file_left_by_an_earlier_process_is_not_taken_for_the_node_serving(metadata_uri, tmp_path):
    ready_file = tmp_path / "node-1.ready"
    node = start_node(node_command(tmp_path / "node-1", 0, metadata_uri, "node-1"), "node-1", 60,
                      ready_file=ready_file)
    try:
        node.kill()                                   # SIGKILL: the file stays, naming a dead pid
        stale = json.loads(ready_file.read_text())
        assert stale["pid"] == node.pid
        # A node started by another process (as `ledger cluster start` finds one), still starting.
        with subprocess.Popen(["sleep", "30"]) as starting:
            attached = NodeHandle.attach("node-1", starting.pid, ready_file)
            assert attached.check_ready() is None
            write_ready(ready_file, NodeReady("node-1", "127.0.0.1:1", "127.0.0.1:2", starting.pid))
            assert attached.check_ready().address == "127.0.0.1:1"
            starting.kill()
    finally:
        node.kill()


def test_a_node_that_exits_before_it_serves_is_reported_with_its_output(fresh_root, tmp_path):
    """fresh_root was never initialised (`ledger init`): the node refuses to start."""
    with pytest.raises(NodeStartError) as refused:
        start_node(node_command(tmp_path / "node-1", 0, fresh_root, "node-1"), "node-1", 60)
    first, *rest = str(refused.value).splitlines()
    assert first.startswith("storage node node-1 exited with status 1 before it served: "
                            "storage node node-1 refuses to start: metadata root "), first
    assert "ledger init" in first and rest[0] == "--- its output ---", rest
    assert any("refuses to start" in line for line in rest[1:]), rest


def test_with_a_log_file_the_failure_points_at_it_and_quotes_only_this_start(metadata_uri, tmp_path):
    log = tmp_path / "node-1.log"
    log.write_text("an earlier start: storage node node-1 refuses to start: long ago\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        node = launch(node_command(tmp_path / "node-1", port, metadata_uri, "node-1"), "node-1", log_file=log)
        with pytest.raises(NodeStartError) as refused:
            node.wait_ready(60)
    message = str(refused.value)
    assert "\n" not in message and message.endswith(f"(log: {log})"), message
    assert f"cannot listen on 127.0.0.1:{port}" in message and "long ago" not in message, message
    assert "long ago" not in node.output() and "refuses to start" in node.output()


def test_a_node_that_is_not_ready_by_the_deadline_is_reported_and_can_be_killed(tmp_path):
    """A ZooKeeper nobody answers at: the node keeps trying to connect, so it never serves."""
    silent = f"zk://127.0.0.1:{free_port()}/ledgers"
    node = launch(node_command(tmp_path / "node-1", 0, silent, "node-1"), "node-1")
    try:
        with pytest.raises(NodeStartError) as late:
            node.wait_ready(2)
        assert str(late.value).startswith(f"storage node node-1 did not serve within 2s (no {node.ready_file})"), \
            str(late.value)
        assert node.exit_status() is None
    finally:
        node.kill()
    assert node.exit_status() is not None and not node.ready_file.exists()


def test_a_config_error_is_reported_with_the_nodes_one_line(tmp_path):
    with pytest.raises(NodeStartError) as refused:
        start_node(node_command(tmp_path / "node-1", 70000, "zk://127.0.0.1:1/ledgers", "node-1"), "node-1", 30)
    assert str(refused.value).splitlines()[0] == ("storage node node-1 exited with status 2 before it served: "
                                                  "storage node: --port 70000 is not a TCP port (0..65535; 0 picks "
                                                  "a free one)")


def test_every_log_line_names_the_node_and_log_level_filters_them(metadata_uri, tmp_path):
    node = start_node(node_command(tmp_path / "debug", 0, metadata_uri, "debug-node", "--log-level", "debug"),
                      "debug-node", 60)
    quiet = start_node(node_command(tmp_path / "quiet", 0, metadata_uri, "quiet-node", "--log-level", "WARNING"),
                       "quiet-node", 60)
    try:
        assert node.stop() == 0 and quiet.stop() == 0
        lines = node.output().splitlines()
        assert lines and all(LOG_LINE.match(line) for line in lines), node.output()
        assert {LOG_LINE.match(line)[2] for line in lines} == {"debug-node"}
        assert any(LOG_LINE.match(line)[1] == "DEBUG" for line in lines), node.output()
        serving = [line for line in lines if f"serving on {node.address}" in line]
        assert len(serving) == 1 and " INFO node=debug-node storage_node.node: serving on " in serving[0], serving
        assert "serving on" not in quiet.output() and all(LOG_LINE.match(line) for line in quiet.output().splitlines())
    finally:
        node.kill()
        quiet.kill()


def test_a_bad_log_level_is_a_one_line_usage_error(tmp_path):
    result = subprocess.run(node_command(tmp_path / "node-1", 0, "zk://127.0.0.1:1/ledgers", "node-1",
                                         "--log-level", "LOUD"), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1] == ("storage_node: error: argument --log-level: invalid choice: 'LOUD' "
                                              "(choose from 'DEBUG', 'INFO', 'WARNING', 'ERROR')"), result.stderr
