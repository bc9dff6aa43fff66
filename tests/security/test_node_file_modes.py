"""A storage node's files are its own user's (storage_node/file_modes.py): the journal holds every ledger's master
key and payload, so no file or directory the node writes may be readable by other local users, whatever the
umask.

Security audit 2026-12: under umask 022 journal segments, checkpoints and compacted files were created 0644 and
the data and journal directories 0755."""
from __future__ import annotations

import os
import pathlib
import stat

import pytest

from metadata.model import Fragment, LedgerMetadata
from protos import ledger_pb2 as pb
from protos.digest import password_hash
from storage_node.checkpoint import DELTA_PREFIX, SNAPSHOT_NAME
from tests.harness.node_client import PASSWORD, NodeClient, make_entry, payload_for
from tests.harness.poll import poll_until

MiB = 1 << 20
NODE_ARGS = ("--gc-interval", "0.3", "--gc-grace", "0", "--journal-segment-bytes", str(MiB),
             "--compaction-threshold", "0.8", "--checkpoint-interval", "0.3")


@pytest.fixture
def umask_022():
    """The usual umask: it leaves group and others read and search permission on whatever is created."""
    before = os.umask(0o022)
    yield
    os.umask(before)


def open_to_others(root: pathlib.Path) -> list[str]:
    return sorted(f"{stat.filemode(path.lstat().st_mode)} {path}" for path in (root, *root.rglob("*"))
                  if path.lstat().st_mode & (stat.S_IRWXG | stat.S_IRWXO))


def test_a_node_creates_every_file_and_directory_for_its_user_alone_and_closes_an_open_data_dir(
        umask_022, start_node, store, tmp_path):
    data_dir = tmp_path / "node-1"
    data_dir.mkdir()
    os.chmod(data_dir, 0o755)         # made by an operator, open to everyone
    node = start_node("node-1", *NODE_ARGS, data_dir=data_dir)
    meta = LedgerMetadata(ledger_id=0, ensemble_size=1, write_quorum=1, ack_quorum=1,
                          fragments=(Fragment(0, ("node-1",)),), password_hash=password_hash(PASSWORD))
    ledgers = [store.create_ledger(meta).value.ledger_id for _ in range(4)]
    with NodeClient(node.address) as client:
        for entry_id in range(60):    # interleaved, 1 MiB segments: several segments, each with every ledger
            results = client.add(*(make_entry(l, entry_id, payload_for(l, entry_id, 8000)) for l in ledgers))
            assert {r.status for r in results} == {pb.OK}
        for ledger_id in ledgers[::2]:
            store.delete_ledger(ledger_id)
        journal = data_dir / "journal"
        poll_until(lambda: list(journal.glob("compacted-*")) and list(data_dir.glob(DELTA_PREFIX + "*")), 30,
                   what="a compacted journal file and a checkpoint delta")
    names = {path.name for path in (*data_dir.iterdir(), *journal.iterdir())}
    assert {"COOKIE", "LOCK", SNAPSHOT_NAME} <= names and any(n.startswith("segment-") for n in names), names
    assert open_to_others(data_dir) == []
    assert node.stop() == 0           # the shutdown checkpoint, too
    assert open_to_others(data_dir) == []

