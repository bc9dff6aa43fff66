"""The cookie check (rule 8): a wiped, swapped or foreign data directory is refused at start, and so is a
lost, emptied or foreign journal directory or a deleted snapshot; directories from before journal cookies
are migrated."""
from __future__ import annotations

import errno
import json
import shutil
import socket

import pytest

from metadata import registry
from metadata.model import Cookie
from protos import ledger_pb2 as pb
from storage_node.cookie import check_cookie, read_disk_cookie, write_disk_cookie
from storage_node.errors import CookieMismatchError
from tests.harness.node_client import NodeClient, make_entry

# Driven with fixed ledger ids that have no metadata: the nodes bind master keys unchecked
# (--bind-keys-unchecked; the check itself: tests/security/test_ledger_claims.py).
pytestmark = pytest.mark.keys_unchecked


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


# -- every directory the node writes carries the check (rule 8) ------------------------------------

def node_with_data(start_node, node_id: str = "node-a"):
    """A node that acknowledged an entry; it wrote its first snapshot when it started."""
    node = start_node(node_id)
    add_one(node)
    return node


def assert_refused(node, *phrases: str) -> None:
    node.start(expect_failure=True)
    assert node.process.returncode != 0
    log = node.log()
    for phrase in phrases:
        assert phrase in log, log


def assert_acknowledged_entry(node) -> None:
    with NodeClient(node.address) as client:
        read = client.read(1, 0)
        assert read.status == pb.OK and read.payload == b"acknowledged", read.message


def test_deleted_journal_directory_is_refused_naming_it(start_node):
    node = node_with_data(start_node)
    node.kill()                 # no checkpoint since the add: only the journal holds the entry
    shutil.rmtree(node.data_dir / "journal")
    assert_refused(node, f"journal directory {node.data_dir / 'journal'} is missing", "not mounted", "decommission")


def test_emptied_journal_directory_is_refused_naming_it(start_node):
    node = node_with_data(start_node)
    node.kill()
    for path in (node.data_dir / "journal").iterdir():
        path.unlink()
    assert_refused(node, f"journal directory {node.data_dir / 'journal'} has no cookie and no journal file",
                   "decommission")


def test_journal_files_deleted_under_a_kept_journal_cookie_are_refused(start_node):
    node = node_with_data(start_node)
    node.kill()
    for path in (node.data_dir / "journal").glob("*.log"):
        path.unlink()
    assert_refused(node, f"journal directory {node.data_dir / 'journal'} has its cookie but no journal file")


def test_deleted_snapshot_is_refused_naming_it(start_node):
    node = node_with_data(start_node)
    assert node.stop() == 0     # a clean stop writes a snapshot
    snapshot = node.data_dir / "snapshot"
    snapshot.unlink()
    assert_refused(node, f"the checkpoint snapshot {snapshot} is missing", "decommission")


def test_journal_of_another_node_is_refused(start_node):
    a = node_with_data(start_node, "node-a")
    b = node_with_data(start_node, "node-b")
    a.kill()
    b.kill()
    shutil.rmtree(a.data_dir / "journal")
    shutil.copytree(b.data_dir / "journal", a.data_dir / "journal")
    assert_refused(a, f"journal directory {a.data_dir / 'journal'} holds the cookie of node node-b")


def test_restarts_after_a_crash_and_a_clean_stop_serve_the_acknowledged_entry(start_node):
    node = start_node("node-a")
    add_one(node)
    node.restart()
    assert_acknowledged_entry(node)
    assert node.stop() == 0
    node.start()
    assert_acknowledged_entry(node)


def test_directory_from_before_journal_cookies_is_migrated(start_node):
    node = node_with_data(start_node)
    assert node.stop() == 0
    (node.data_dir / "journal" / "COOKIE").unlink()           # the layout before journal cookies ...
    cookie = node.data_dir / "COOKIE"
    fields = json.loads(cookie.read_text())
    del fields["snapshot"]                                      # ... and before the snapshot was recorded
    cookie.write_text(json.dumps(fields))
    node.start()
    assert_acknowledged_entry(node)
    assert json.loads((node.data_dir / "journal" / "COOKIE").read_text())["instance_id"] == fields["instance_id"]
    assert json.loads(cookie.read_text())["snapshot"] is True


def test_a_leftover_journal_cookie_of_an_interrupted_first_start_is_replaced(store, tmp_path):
    journal = tmp_path / "journal"
    journal.mkdir(parents=True)
    write_disk_cookie(journal, Cookie("node-a", "an-earlier-attempt", str(tmp_path), 0.0))
    cookie = check_cookie(store, tmp_path, "node-a")
    assert read_disk_cookie(journal) == cookie == read_disk_cookie(tmp_path)
    assert registry.read_cookie(store, "node-a").value == cookie


def test_a_cookie_without_any_journal_is_refused_once_zookeeper_knows_the_node(store, tmp_path):
    """The rule for a directory from before journal cookies that has no journal file: refused, because a
    lost journal looks the same (cookie.py explains why only a node that never opened its journal is like it)."""
    cookie = check_cookie(store, tmp_path, "node-a")
    shutil.rmtree(tmp_path / "journal")
    with pytest.raises(CookieMismatchError, match="journal directory .* is missing"):
        check_cookie(store, tmp_path, "node-a")
    assert read_disk_cookie(tmp_path) == cookie


def test_a_refused_restart_names_its_reason_even_when_its_old_port_was_taken_meanwhile(start_node):
    """The harness's restart that is to fail binds a port of its own (tests/harness/node_process.py): another
    process may hold the killed node's port by then, as one once did in a full run."""
    node = node_with_data(start_node)
    node.kill()
    shutil.rmtree(node.data_dir / "journal")
    with socket.socket() as taken:
        try:
            taken.bind(("127.0.0.1", node.port))
            taken.listen()
        except OSError as exc:   # another process took the port first (seen in CI): taken all the same
            if exc.errno != errno.EADDRINUSE:
                raise
        assert_refused(node, f"journal directory {node.data_dir / 'journal'} is missing")
