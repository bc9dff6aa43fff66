"""The Spark driver's liveness registration (connector/spark/driver.py), which the janitor trusts to tell a
driver that is gone from one that is only slow: held by a keeper process for as long as the driver process
lives (also while it is paused), or by the driver process itself; ended once no registry names it.

Real ZooKeeper; the "driver" is a real process standing in for a Spark driver's JVM, paused and killed.
"""
import os
import signal
import subprocess
import sys
import tempfile
import threading

import psutil
import pytest

from connector.spark import driver
from connector.spark.driver import (
    DriverProcess, DriverRegistrationError, KeeperFiles, keeper_registration, registered_driver,
)
from connector.spark.jobs import remove_job, start_job
from metadata import registry
from tests.harness.poll import poll_until


@pytest.fixture
def jvm():
    """A process standing in for a driver's JVM."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield process
    process.send_signal(signal.SIGCONT)
    process.kill()
    process.wait(30)


@pytest.fixture
def keeper_dir(tmp_path, monkeypatch):
    """The keepers' files go to a directory of this test's own (the real one holds other drivers' files)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return driver.keeper_directory()


def stand_in(process: subprocess.Popen) -> DriverProcess:
    return DriverProcess(process.pid, psutil.Process(process.pid).create_time())


def keeper_of(files: KeeperFiles) -> psutil.Process:
    return psutil.Process(files.read_state()["keeper"])


def test_a_keeper_holds_the_registration_while_the_driver_lives_paused_or_not_and_ends_with_it(
        jvm, store, metadata_uri):
    driver_process = stand_in(jvm)
    with keeper_registration(store, driver_process, metadata_uri) as driver_id:
        start_job(store, "job-1", "events", driver_id)
    files = KeeperFiles.of(driver_process, metadata_uri)
    keeper = keeper_of(files)
    assert registry.writer_alive(store, driver_id)
    with keeper_registration(store, driver_process, metadata_uri) as again:
        assert again == driver_id  # one registration serves every job of the driver

    jvm.send_signal(signal.SIGSTOP)  # a paused driver is alive: the keeper (a session of its own) goes on
    poll_until(lambda: psutil.Process(jvm.pid).status() == psutil.STATUS_STOPPED, 30, what="the driver to stop")
    assert registry.writer_alive(store, driver_id) and keeper.is_running()

    jvm.kill()
    jvm.wait(30)
    poll_until(lambda: not registry.writer_alive(store, driver_id), 30, what="the registration to go")
    poll_until(lambda: not keeper.is_running() or keeper.status() == psutil.STATUS_ZOMBIE, 30,
               what="the keeper to exit")
    assert not files.state.exists()


def test_a_keeper_ends_once_no_registry_names_its_driver(jvm, store, metadata_uri, monkeypatch):
    monkeypatch.setattr(driver, "IDLE_SECONDS", 1.0)
    driver_process = stand_in(jvm)
    with keeper_registration(store, driver_process, metadata_uri) as driver_id:
        start_job(store, "job-1", "events", driver_id)
    files = KeeperFiles.of(driver_process, metadata_uri)
    keeper = keeper_of(files)
    remove_job(store, "job-1")  # the job ended
    poll_until(lambda: not registry.writer_alive(store, driver_id), 60, what="the idle registration to end")
    poll_until(lambda: not keeper.is_running() or keeper.status() == psutil.STATUS_ZOMBIE, 30,
               what="the keeper to exit")
    assert not files.state.exists()
    with keeper_registration(store, driver_process, metadata_uri) as next_id:  # the driver's next job
        assert next_id != driver_id and registry.writer_alive(store, next_id)


def test_this_processs_registration_lasts_while_a_registry_names_it_then_ends(store, metadata_uri, monkeypatch):
    """Here the driver is this process (no Spark worker above it): it holds the registration itself."""
    monkeypatch.setattr(driver, "IDLE_SECONDS", 0.4)
    checks = threading.Semaphore(0)
    idle = driver._idle

    def counted(*args):
        checks.release()
        return idle(*args)

    monkeypatch.setattr(driver, "_idle", counted)
    with registered_driver(store, metadata_uri) as driver_id:
        start_job(store, "job-1", "events", driver_id)
    assert driver_id.startswith("spark-driver-") and f"-{psutil.Process().pid}-" in driver_id
    for _ in range(5):  # five looks over more than the idle time: the job names it, it stays
        assert checks.acquire(timeout=30)
    assert registry.writer_alive(store, driver_id)

    remove_job(store, "job-1")
    poll_until(lambda: not registry.writer_alive(store, driver_id), 30, what="the idle registration to end")
    with registered_driver(store, metadata_uri) as next_id:
        assert next_id != driver_id and registry.writer_alive(store, next_id)
        start_job(store, "job-2", "events", next_id)
    remove_job(store, "job-2")


def test_a_registration_the_callers_session_does_not_see_yet_is_retired_not_ended(store, metadata_uri,
                                                                                   monkeypatch):
    """Auditor audit 2026-11-29: after an outage that expired sessions, the caller's session can be back before the
    held registration's own session has created its znode again; the job start then ended that registration for
    good, though a running job still named it, and the next janitor took the job's ledgers for abandoned. It is
    now retired (new jobs get a new one) and ends once no registry names it."""
    monkeypatch.setattr(driver, "IDLE_SECONDS", 0.4)
    with registered_driver(store, metadata_uri) as first:
        start_job(store, "job-1", "events", first)       # a running job names it
    alive = registry.writer_alive
    monkeypatch.setattr(registry, "writer_alive", lambda s, d: d != first and alive(s, d))   # not seen yet
    with registered_driver(store, metadata_uri) as second:
        start_job(store, "job-2", "events", second)
    monkeypatch.setattr(registry, "writer_alive", alive)
    assert second != first and registry.writer_alive(store, first) and registry.writer_alive(store, second)
    remove_job(store, "job-1")                           # then the retired one ends, idle
    poll_until(lambda: not registry.writer_alive(store, first), 30, what="the retired registration to end")
    assert registry.writer_alive(store, second)
    remove_job(store, "job-2")


def test_the_driver_is_the_first_process_above_spark_workers():
    """Spark calls prepare() in its Python workers (`python -m pyspark.daemon ...` and their forks), which come
    and go: the driver is the first process above them (the JVM). Here this test process stands for the JVM,
    and two processes whose command lines read like a Spark daemon and its worker for Spark's workers."""
    find = "from connector.spark.driver import DriverProcess; print(DriverProcess.find().pid)"
    worker = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {find!r}, '-m', 'pyspark.worker'])"
    out = subprocess.run([sys.executable, "-c", worker, "-m", "pyspark.daemon"], capture_output=True, text=True)
    assert out.stdout.split() == [str(psutil.Process().pid)], out.stderr
    plain = subprocess.run([sys.executable, "-c", find], capture_output=True, text=True)
    assert plain.stdout.split() != [str(psutil.Process().pid)]  # not under Spark: that process is the driver


def test_a_keeper_started_ahead_is_the_one_the_job_start_takes_over(jvm, store, metadata_uri):
    driver_process = stand_in(jvm)
    files = KeeperFiles.of(driver_process, metadata_uri)
    with driver.keeper_started_ahead(driver_process, metadata_uri):
        ahead = driver._ahead[files.base]
        with keeper_registration(store, driver_process, metadata_uri) as driver_id:
            start_job(store, "job-1", "events", driver_id)
    assert driver_id == ahead.driver_id and files.read_state()["keeper"] == ahead.process.pid
    assert ahead.process.poll() is None
    assert registry.writer_alive(store, driver_id) and files.base not in driver._ahead


def test_a_keeper_started_ahead_of_a_job_start_that_fails_is_stopped(jvm, store, metadata_uri):
    driver_process = stand_in(jvm)
    files = KeeperFiles.of(driver_process, metadata_uri)
    with pytest.raises(ValueError):
        with driver.keeper_started_ahead(driver_process, metadata_uri):
            ahead = driver._ahead[files.base]
            poll_until(lambda: registry.writer_alive(store, ahead.driver_id), 30, what="the keeper to register")
            raise ValueError("the stream cannot take these rows")
    poll_until(lambda: ahead.process.poll() is not None, 30, what="the keeper started ahead to stop")
    poll_until(lambda: not registry.writer_alive(store, ahead.driver_id), 30, what="its registration to go")
    assert files.base not in driver._ahead


def test_no_keeper_starts_ahead_while_the_drivers_keeper_runs(jvm, store, metadata_uri):
    driver_process = stand_in(jvm)
    files = KeeperFiles.of(driver_process, metadata_uri)
    with keeper_registration(store, driver_process, metadata_uri) as driver_id:
        start_job(store, "job-1", "events", driver_id)
    keepers = {keeper.pid for keeper in driver._started}
    with driver.keeper_started_ahead(driver_process, metadata_uri):
        assert files.base not in driver._ahead
        with keeper_registration(store, driver_process, metadata_uri) as again:
            assert again == driver_id
    assert {keeper.pid for keeper in driver._started} <= keepers   # no keeper was started


def test_a_job_start_whose_keeper_started_ahead_ended_idle_meanwhile_starts_another(jvm, store, metadata_uri,
                                                                                   monkeypatch):
    monkeypatch.setattr(driver, "IDLE_SECONDS", 1.0)
    driver_process = stand_in(jvm)
    files = KeeperFiles.of(driver_process, metadata_uri)
    with driver.keeper_started_ahead(driver_process, metadata_uri):
        ahead = driver._ahead[files.base]
        poll_until(lambda: ahead.process.poll() is not None, 60, what="the keeper started ahead to end idle")
        with keeper_registration(store, driver_process, metadata_uri) as driver_id:
            start_job(store, "job-1", "events", driver_id)
    assert driver_id != ahead.driver_id and registry.writer_alive(store, driver_id)
    assert not registry.writer_alive(store, ahead.driver_id)


def test_the_wait_for_a_registration_is_woken_by_a_watch(store):
    woken = threading.Event()
    assert not registry.writer_alive(store, "writer-watched", lambda event: woken.set())
    registration = registry.register_writer(store, "writer-watched")
    try:
        assert woken.wait(30) and registry.writer_alive(store, "writer-watched")
    finally:
        registration.close()


def test_a_keeper_ending_idle_has_deleted_its_registration_before_job_starts_may_look(jvm, store, metadata_uri):
    """_end_idle deletes the registration under the lock job starts take: once the lock is free again, no job
    start can find the registration there and name it as it goes."""
    driver_process = stand_in(jvm)
    files = KeeperFiles.of(driver_process, metadata_uri)
    registration = registry.register_writer(store, "driver-ending")
    try:
        assert driver._end_idle(store, "driver-ending", files, registration)
        with files.locked():   # where a job start looks
            assert not registry.writer_alive(store, "driver-ending")
    finally:
        registration.close()


# Growth audit 2026-11-29: keeper files piled up in /tmp/ledger-spark-drivers-UID (134 locks, 92 logs, 15 states on
# one machine): a keeper stopped by SIGTERM, one started ahead and stopped, one killed or crashed at its start,
# each left its files, and nothing removed those of drivers long gone.


def files_of(directory, files: KeeperFiles) -> list[str]:
    return sorted(path.name for path in directory.iterdir() if path.name.startswith(files.base.name))


def test_a_keeper_stopped_by_a_signal_removes_its_files(jvm, store, metadata_uri, keeper_dir):
    driver_process = stand_in(jvm)
    with keeper_registration(store, driver_process, metadata_uri) as driver_id:
        start_job(store, "job-1", "events", driver_id)
    files = KeeperFiles.of(driver_process, metadata_uri)
    keeper = keeper_of(files)
    assert files_of(keeper_dir, files) == [f"{files.base.name}{suffix}" for suffix in (".json", ".lock", ".log")]
    keeper.terminate()
    poll_until(lambda: not keeper.is_running() or keeper.status() == psutil.STATUS_ZOMBIE, 30,
               what="the keeper to exit")
    assert files_of(keeper_dir, files) == [] and not registry.writer_alive(store, driver_id)


def test_a_keeper_started_ahead_and_stopped_leaves_no_files(jvm, store, metadata_uri, keeper_dir):
    driver_process = stand_in(jvm)
    files = KeeperFiles.of(driver_process, metadata_uri)
    for wait_for_registration in (False, True):   # stopped as it starts, and once registered
        with pytest.raises(ValueError):
            with driver.keeper_started_ahead(driver_process, metadata_uri):
                ahead = driver._ahead[files.base]
                if wait_for_registration:
                    poll_until(lambda: registry.writer_alive(store, ahead.driver_id), 30, what="the registration")
                raise ValueError("the stream cannot take these rows")
        poll_until(lambda: ahead.process.poll() is not None, 30, what="the keeper started ahead to stop")
        assert files_of(keeper_dir, files) == []


def test_the_files_of_drivers_gone_are_removed_when_a_keeper_starts(jvm, store, metadata_uri, zookeeper,
                                                                   keeper_dir):
    """A keeper that could not register (here: its root was never initialised) leaves its log, which the error
    names; once its driver is gone, the next keeper start on the host removes it, and also the files of a driver
    whose pid now belongs to another process. A live driver's files and other files stay."""
    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    gone_driver, wrong_root = stand_in(gone), zookeeper.uri(f"/t{os.getpid()}-never-initialised/ledgers")
    try:
        with pytest.raises(DriverRegistrationError, match="log: "):
            with keeper_registration(store, gone_driver, wrong_root):
                pass
        gone_files = KeeperFiles.of(gone_driver, wrong_root)
        assert "was never initialised" in gone_files.log.read_text()
    finally:
        gone.kill()
        gone.wait(30)
    reused = KeeperFiles.of(DriverProcess(os.getpid(), psutil.Process().create_time() - 5), metadata_uri)
    reused.write_state("spark-driver-of-a-pid-now-reused", 1)
    reused.base.with_suffix(".lock").touch()
    (keeper_dir / "notes.txt").write_text("not a keeper's")
    assert files_of(keeper_dir, gone_files) and files_of(keeper_dir, reused)

    driver_process = stand_in(jvm)
    with keeper_registration(store, driver_process, metadata_uri) as driver_id:
        start_job(store, "job-1", "events", driver_id)
    files = KeeperFiles.of(driver_process, metadata_uri)
    assert sorted(path.name for path in keeper_dir.iterdir()) == sorted(files_of(keeper_dir, files) + ["notes.txt"])
    assert files_of(keeper_dir, files) == [f"{files.base.name}{suffix}" for suffix in (".json", ".lock", ".log")]
