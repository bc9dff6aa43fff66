"""The cookie check (rule 8): a wiped, swapped or foreign data directory is refused at start."""
from __future__ import annotations

import shutil

from metadata import registry
from protos import ledger_pb2 as pb
from tests.harness.node_client import NodeClient, make_entry


def add_one(node) -> None:
    with NodeClient(node.address) as client:
        assert client.add(make_entry(1, 0, b"acknowledged"))[0].status == pb.OK


def test_wiped_data_directory_is_refused_naming_the_cookie(start_node):
    node = start_node("node-a")
    add_one(node)
    node.kill()
    shutil.rmtree(node.data_dir)
    node.data_dir.mkdir()
    node.start(expect_failure=True)
    assert node.process.returncode != 0
    log = node.log()
    assert "has no cookie but ZooKeeper has a cookie for node node-a" in log
    assert "wiped or swapped" in log and "decommission" in log


def test_directory_of_another_node_is_refused(start_node, tmp_path):
    a = start_node("node-a")
    b = start_node("node-b")
    add_one(a)
    a.kill()
    b.kill()
    imposter = start_node("node-a", data_dir=b.data_dir, expect_failure=True)
    assert imposter.process.returncode != 0
    assert "holds the cookie of node node-b" in imposter.log()


def test_swapped_directory_of_an_earlier_incarnation_is_refused(start_node, store, tmp_path):
    old = start_node("node-a", data_dir=tmp_path / "old-a")
    add_one(old)
    old.kill()
    registry.delete_cookie(store, "node-a")         # an operator "fixed" it the wrong way ...
    new = start_node("node-a", data_dir=tmp_path / "new-a")   # ... and reused the id on a new disk
    new.kill()
    swapped_back = start_node("node-a", data_dir=tmp_path / "old-a", expect_failure=True)
    assert swapped_back.process.returncode != 0
    assert "the directory was swapped" in swapped_back.log()


def test_data_directory_unknown_to_zookeeper_is_refused(start_node, store):
    node = start_node("node-a")
    add_one(node)
    node.kill()
    registry.delete_cookie(store, "node-a")
    node.start(expect_failure=True)
    assert node.process.returncode != 0
    assert "ZooKeeper" in node.log() and "has no cookie for it" in node.log()
