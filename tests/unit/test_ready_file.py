"""The ready file (protos/ready_file.py): its path is on the node's command line for every local user to see, and
often in the shared temporary directory, so it is never written through a link planted there, and a launcher
never believes a link or another user's file."""
from __future__ import annotations

import os
import stat

import pytest

from protos.ready_file import NodeReady, read_ready, write_ready


def test_the_ready_file_is_never_written_through_a_planted_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    ready_file = tmp_path / "node-1.ready"
    ready_file.with_name("node-1.ready.tmp").symlink_to(victim)   # as a user who read the node's command line
    write_ready(ready_file, NodeReady("node-1", "127.0.0.1:1", "127.0.0.1:2", 42))
    assert victim.read_text() == "precious\n"
    assert not ready_file.is_symlink() and read_ready(ready_file).address == "127.0.0.1:1"
    assert stat.S_IMODE(ready_file.stat().st_mode) == 0o600


def test_a_ready_file_that_is_a_link_is_not_believed(tmp_path):
    planted = tmp_path / "planted.json"
    write_ready(planted, NodeReady("node-1", "10.6.6.6:1", "10.6.6.6:2", 42))
    ready_file = tmp_path / "node-1.ready"
    ready_file.symlink_to(planted)
    with pytest.raises(ValueError, match="symbolic link"):
        read_ready(ready_file)


def test_a_ready_file_another_user_wrote_is_not_believed(tmp_path, monkeypatch):
    ready_file = tmp_path / "node-1.ready"
    write_ready(ready_file, NodeReady("node-1", "10.6.6.6:1", "10.6.6.6:2", 42))
    monkeypatch.setattr(os, "geteuid", lambda: ready_file.stat().st_uid + 1)   # as if another user planted it
    with pytest.raises(ValueError, match="wrote it, not this user"):
        read_ready(ready_file)
