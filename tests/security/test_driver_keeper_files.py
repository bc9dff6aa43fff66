"""The Spark driver keepers' files (connector/spark/driver.py) live in a directory with a predictable name in the
shared temporary directory: another local user must not be able to make it first, link it elsewhere, or plant
links in it, to read or overwrite what a driver writes; and the file names, on the keeper's command line for
everyone to see, must not carry a hash of the metadata URI's secret.

Security audit 2026-12 (keeperdir.py): a directory another user made (mode 0777) was used as it was, and the
state was written through a link planted at its temporary name, overwriting the link's target."""
from __future__ import annotations

import os
import stat
import tempfile

import psutil
import pytest

from connector.spark import driver
from connector.spark.driver import DriverProcess, DriverRegistrationError, KeeperFiles

URI = "zk://spark:s3cret@127.0.0.1:2181/ledgers"


@pytest.fixture
def temporary_dir(tmp_path, monkeypatch):
    """The temporary directory the keepers' directory is made in: this test's own."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@pytest.fixture
def this_driver() -> DriverProcess:
    return DriverProcess(os.getpid(), psutil.Process().create_time())


def test_the_directory_is_made_for_this_user_alone(temporary_dir, this_driver):
    before = os.umask(0o022)
    try:
        files = KeeperFiles.of(this_driver, URI)
    finally:
        os.umask(before)
    assert files.base.parent == driver.keeper_directory()
    assert stat.S_IMODE(files.base.parent.lstat().st_mode) == 0o700


def test_a_directory_another_user_made_first_is_refused(temporary_dir, this_driver, monkeypatch):
    monkeypatch.setattr(os, "getuid", lambda: os.geteuid() + 1)   # the directory below is then another user's
    squatted = driver.keeper_directory()
    squatted.mkdir()
    os.chmod(squatted, 0o777)
    with pytest.raises(DriverRegistrationError, match=f"{squatted} belongs to user {os.geteuid()}.*remove it"):
        KeeperFiles.of(this_driver, URI)
    assert list(squatted.iterdir()) == []


def test_a_link_in_place_of_the_directory_is_refused(temporary_dir, this_driver):
    elsewhere = temporary_dir / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    driver.keeper_directory().symlink_to(elsewhere)
    with pytest.raises(DriverRegistrationError, match="is not a directory"):
        KeeperFiles.of(this_driver, URI)


def test_a_directory_of_this_users_open_to_others_is_refused(temporary_dir, this_driver):
    opened = driver.keeper_directory()
    opened.mkdir()
    os.chmod(opened, 0o733)
    with pytest.raises(DriverRegistrationError, match=r"is open to other users \(mode drwx-wx-wx\)"):
        KeeperFiles.of(this_driver, URI)


def test_files_are_never_written_through_a_planted_link(temporary_dir, this_driver):
    files = KeeperFiles.of(this_driver, URI)
    victim = temporary_dir / "victim"
    victim.write_text("precious\n")
    files.state.with_suffix(".tmp").symlink_to(victim)
    files.write_state("spark-driver-1", 1234)
    assert victim.read_text() == "precious\n"
    assert not files.state.is_symlink() and files.read_state() == {"driver": "spark-driver-1", "keeper": 1234}
    assert stat.S_IMODE(files.state.stat().st_mode) == 0o600
    files.state.unlink()
    files.state.symlink_to(victim)
    assert files.read_state() is None
    files.base.with_suffix(".lock").symlink_to(victim)
    with pytest.raises(OSError):
        with files.locked():
            pass
    assert victim.read_text() == "precious\n"


def test_file_names_do_not_depend_on_the_uris_secret(temporary_dir, this_driver):
    names = {KeeperFiles.of(this_driver, URI.replace("s3cret", secret)).base.name for secret in ("a", "b", "s3cret")}
    assert len(names) == 1
    assert KeeperFiles.of(this_driver, URI.replace("/ledgers", "/other")).base.name not in names
