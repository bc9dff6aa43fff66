"""`ledger cluster start|status|stop --dir DIR` on a directory that holds no cluster, is not a directory, or holds
a damaged cluster.json: one line saying what is wrong and what to do, nothing started, nothing written."""
import dataclasses
import json

import pytest

from connector import cli
from connector.cluster import ClusterState, NodeSpec, TlsFiles, decode_state


def error_of(capsys, *argv: str) -> str:
    assert cli.main(["cluster", *argv]) == 1
    return capsys.readouterr().err


@pytest.mark.parametrize("action", ["status", "stop"])
def test_no_cluster_in_the_directory_says_where_to_run_the_command(capsys, tmp_path, action):
    error = error_of(capsys, action, "--dir", str(tmp_path))
    assert f"no cluster in {tmp_path}" in error
    assert "run the command from the directory where `ledger cluster start` ran, or pass --dir" in error


@pytest.mark.parametrize("under", ["", "sub"])
def test_start_on_a_file_names_dir_and_asks_for_a_directory(capsys, tmp_path, under):
    file = tmp_path / "file"
    file.write_text("kept")
    error = error_of(capsys, "start", "--dir", str(file / under))
    assert error.startswith(f"ledger: error: --dir {file / under}: a file is in the way; give --dir a directory")
    assert file.read_text() == "kept"


@pytest.mark.parametrize("content, what", [
    (b"not json", "not JSON: "),
    (b'{"zk_port": 1}', "not an object with zk_port"),
    (b"[]", "not an object with zk_port"),
    (b"\xff\xfe{", "not UTF-8 text"),
    (b'{"zk_port": 1, "nodes": [{"node_id": "node-1"}]}', "a node or its tls entry is not as recorded"),
    (b'{"zk_port": 1, "nodes": [{"node_id": "node-1", "port": "x"}]}', "a node's port or pid is not a number"),
    # Found by an audit: `cluster start` met these with an OverflowError traceback, its ZooKeeper left running.
    (b'{"zk_port": 1, "nodes": [{"node_id": "node-1", "port": 99999}]}',
     "the port of node 'node-1' is 99999, not a port in 1-65535"),
    (b'{"zk_port": 1, "nodes": [{"node_id": "../../x", "port": 2}]}', "node id '../../x' is not one (1-200 bytes"),
    (b'{"zk_port": 0, "nodes": []}', "zk_port is 0, not a port in 1-65535"),
    (b'{"zk_port": true, "nodes": []}', "not an object with zk_port"),
    (b'{"zk_port": 1, "zk_pid": -7, "nodes": []}', "a pid is negative"),
    (b'{"zk_port": 1, "nodes": [{"node_id": "n", "port": 2}, {"node_id": "n", "port": 3}]}',
     "a node id is recorded twice"),
    (b'{"zk_port": 1, "nodes": [], "tls": {"ca": 1, "node_cert": "a", "node_key": "b", "client_cert": "c", '
     b'"client_key": "d"}}', "a tls entry is not a file name"),
])
@pytest.mark.parametrize("action", ["status", "stop", "start"])
def test_a_damaged_state_file_says_what_is_wrong_and_what_to_do(capsys, tmp_path, content, what, action):
    (tmp_path / "cluster.json").write_bytes(content)
    error = error_of(capsys, action, "--dir", str(tmp_path))
    assert error.startswith(f"ledger: error: {tmp_path / 'cluster.json'} is damaged ({what}"), error
    assert "restore it, or stop the cluster's processes" in error and "empty --dir" in error
    assert (tmp_path / "cluster.json").read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.json"]


def test_a_recorded_state_reads_back_as_it_was_written():
    state = ClusterState(2181, 12, [NodeSpec("node-1", 4000, 13)], TlsFiles("ca", "nc", "nk", "cc", "ck"))
    assert decode_state(json.loads(json.dumps(dataclasses.asdict(state)))) == state
