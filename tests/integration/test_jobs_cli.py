"""`ledger jobs [--apply] [--json]` and the janitor (connector/spark/janitor.py) against drivers in processes of
their own (tests/harness/janitor_driver.py): killed (SIGKILL), paused (SIGSTOP) for less and for longer than
their ZooKeeper session, and killed right after their commit landed. Real ZooKeeper and storage nodes.

What a driver that died leaves (its job's registry and task ledgers) is reported with its ledgers and bytes
and deleted by --apply; the stream's committed rows stay as they were. A driver that is alive, however
paused, is never touched. A driver whose session ended while it was only paused is fenced: its commit fails
cleanly and commits nothing.
"""
import json
import signal
import subprocess
import sys

import pytest

from connector.cli import main as ledger
from connector.spark.jobs import job_registry, query_registry, register_task_ledger, start_job
from connector.client import LedgerClient
from metadata import registry
from metadata.store import MetadataStore
from tests.harness.janitor_driver import ROWS
from tests.harness.poll import poll_until
from tests.harness.spark_tasks import STREAM, Task, TaskRunner, batch_writer, existing, id_batch, stream_sink
from tests.integration.test_spark_commit_outcome import stream_ids

BASE = list(range(100_000, 100_500))  # rows committed before the driver under test starts


class Driver:
    """python -m tests.harness.janitor_driver URI STREAM MODE, and what it printed when ready."""

    def __init__(self, uri: str, mode: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.harness.janitor_driver", uri, STREAM, mode],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        line = self.process.stdout.readline().split()
        assert line[:1] == ["ready"], f"the driver did not get ready: {line}"
        self.owner, self.driver_id = line[1], line[2]
        self.ledgers = [int(i) for i in line[3:]]

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def commit(self) -> str:
        self.process.stdin.write("commit\n")
        self.process.stdin.flush()
        out = self.process.stdout.readline().strip()
        self.process.wait(60)
        return out

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
        self.process.wait(30)


@pytest.fixture
def driver(metadata_uri):
    started = []

    def start(mode: str) -> Driver:
        started.append(Driver(metadata_uri, mode))
        return started[-1]

    yield start
    for each in started:
        each.stop()


@pytest.fixture
def base(cluster, metadata_uri, monkeypatch):
    """3 nodes and a stream holding BASE, committed by a write job of this process."""
    cluster(3)
    writer = batch_writer(metadata_uri)
    writer.commit([TaskRunner(monkeypatch).run(writer, Task(0), [id_batch(range(BASE[0], BASE[-1] + 1))])])
    assert stream_ids(metadata_uri) == BASE


def jobs(capsys, uri: str, *args: str) -> tuple[int, list[dict]]:
    """`ledger jobs --json ARGS`: the exit status and one object per job or query."""
    capsys.readouterr()
    status = ledger(["jobs", "--metadata", uri, "--json", *args])
    return status, [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def gone(uri: str, driver_id: str) -> None:
    """Wait until the driver's liveness registration is gone (its session ended)."""
    with MetadataStore(uri) as store:
        poll_until(lambda: not registry.writer_alive(store, driver_id), 90, interval=0.2,
                   what=f"the registration of {driver_id} to go")


def znode_exists(uri: str, path: str) -> bool:
    with MetadataStore(uri) as store:
        return store.exists(path)


# -- a driver that died -------------------------------------------------------------------------------


def test_ledger_jobs_reports_a_killed_drivers_job_and_apply_deletes_what_it_left(base, driver, metadata_uri, capsys):
    job = driver("job")
    status, found = jobs(capsys, metadata_uri)
    assert status == 0 and [(r["id"], r["state"]) for r in found] == [(job.owner, "running")]

    job.signal(signal.SIGKILL)
    assert sorted(existing(metadata_uri, job.ledgers)) == job.ledgers  # what a dead driver leaves behind
    gone(metadata_uri, job.driver_id)
    status, found = jobs(capsys, metadata_uri)
    assert status == 0 and len(found) == 1
    row = found[0]
    assert (row["kind"], row["id"], row["streams"], row["drivers"], row["state"]) == (
        "job", job.owner, [STREAM], [job.driver_id], "abandoned")
    assert sorted(ledger["state"] for ledger in row["ledgers"]) == ["CLOSED", "OPEN"]
    closed = next(ledger for ledger in row["ledgers"] if ledger["state"] == "CLOSED")
    assert closed["bytes"] > ROWS * 8 and closed["replicas"] == 3
    assert row["bytes"] == closed["bytes"] and row["stored_bytes"] == 3 * closed["bytes"]

    status, found = jobs(capsys, metadata_uri, "--apply")
    assert status == 0
    assert sorted(found[0]["outcome"]["deleted"]) == job.ledgers and found[0]["outcome"]["kept"] == []
    assert not existing(metadata_uri, job.ledgers)
    assert not znode_exists(metadata_uri, job_registry(job.owner).path)
    assert stream_ids(metadata_uri) == BASE
    assert jobs(capsys, metadata_uri) == (0, [])


def test_a_commit_that_landed_just_before_its_driver_died_keeps_its_rows(base, driver, metadata_uri, capsys):
    job = driver("committed")
    job.signal(signal.SIGKILL)
    gone(metadata_uri, job.driver_id)
    status, found = jobs(capsys, metadata_uri, "--apply")
    assert status == 0
    assert found[0]["outcome"]["deleted"] == [] and sorted(found[0]["outcome"]["kept"]) == job.ledgers
    assert not znode_exists(metadata_uri, job_registry(job.owner).path)
    assert stream_ids(metadata_uri) == BASE + list(range(0, 2 * ROWS))


def test_a_killed_querys_uncommitted_batch_is_deleted_and_a_restart_of_the_query_goes_on(
        base, driver, metadata_uri, capsys, monkeypatch, tmp_path):
    run = driver("query")
    run.signal(signal.SIGKILL)
    gone(metadata_uri, run.driver_id)
    status, found = jobs(capsys, metadata_uri)
    assert [(r["kind"], r["id"], r["state"], len(r["ledgers"])) for r in found] == [
        ("query", run.owner, "abandoned", 2)]
    status, found = jobs(capsys, metadata_uri, "--apply")
    assert status == 0 and sorted(found[0]["outcome"]["deleted"]) == run.ledgers
    assert not existing(metadata_uri, run.ledgers)
    assert not znode_exists(metadata_uri, query_registry(run.owner).path)
    assert stream_ids(metadata_uri) == BASE + list(range(0, 2 * ROWS))

    # The query restarts from its checkpoint (same query id, another driver) and replays batch 1.
    sink = stream_sink(metadata_uri, tmp_path)
    assert sink.query_id == run.owner
    sink.commit([TaskRunner(monkeypatch).run(sink, Task(0, batch=1), [id_batch(range(2 * ROWS, 3 * ROWS))])], 1)
    assert stream_ids(metadata_uri) == BASE + list(range(0, 3 * ROWS))


# -- a driver that is only paused ---------------------------------------------------------------------


def test_a_paused_driver_is_never_touched_and_its_commit_lands(base, driver, metadata_uri, capsys, monkeypatch):
    job = driver("job")
    job.signal(signal.SIGSTOP)
    status, found = jobs(capsys, metadata_uri, "--apply")
    assert status == 0 and found[0]["state"] == "running" and "outcome" not in found[0]
    next_job = batch_writer(metadata_uri)  # the next job on the stream: its start runs the janitor too
    next_job.commit([TaskRunner(monkeypatch).run(next_job, Task(0), [id_batch(range(200_000, 200_010))])])
    assert sorted(existing(metadata_uri, job.ledgers)) == job.ledgers
    assert znode_exists(metadata_uri, job_registry(job.owner).path)

    job.signal(signal.SIGCONT)
    assert job.commit() == "committed"
    assert stream_ids(metadata_uri) == BASE + list(range(200_000, 200_010)) + list(range(0, ROWS))
    assert not znode_exists(metadata_uri, job_registry(job.owner).path)
    assert existing(metadata_uri, job.ledgers) == {job.ledgers[0]}  # the held task's ledger was not reported


@pytest.mark.parametrize("mode", ["job", "query"])
def test_a_driver_paused_past_its_session_is_fenced_and_its_commit_fails_cleanly(
        base, driver, metadata_uri, capsys, mode):
    """Its registration ended with its session while it was paused: the janitor cleans its job (fencing the OPEN
    ledger its paused task writes), and when it comes back its commit is refused and commits nothing."""
    run = driver(mode)
    before = stream_ids(metadata_uri)
    run.signal(signal.SIGSTOP)
    gone(metadata_uri, run.driver_id)
    status, found = jobs(capsys, metadata_uri, "--apply")
    assert status == 0 and sorted(found[0]["outcome"]["deleted"]) == run.ledgers
    assert not existing(metadata_uri, run.ledgers)

    run.signal(signal.SIGCONT)
    outcome = run.commit()
    assert outcome.startswith("commit failed: WriteJobEndedError"), outcome
    assert stream_ids(metadata_uri) == before
    assert not existing(metadata_uri, run.ledgers)


# -- registries of an older version ------------------------------------------------------------------


def test_a_registry_that_names_no_driver_is_cleaned_only_with_legacy(cluster, metadata_uri, capsys):
    cluster(3)
    with LedgerClient(metadata_uri) as lc:
        start_job(lc.store, "old-job", STREAM)  # as the previous version wrote it: no driver
        entry = register_task_ledger(lc.store, job_registry("old-job"))
        lc.create_ledger(ledger_id=entry.ledger_id, guard=entry.path).close()
    status, found = jobs(capsys, metadata_uri, "--apply")
    assert status == 0 and found[0]["state"] == "unknown" and "outcome" not in found[0]
    assert existing(metadata_uri, [entry.ledger_id])
    status, found = jobs(capsys, metadata_uri, "--apply", "--legacy")
    assert status == 0 and found[0]["outcome"]["deleted"] == [entry.ledger_id]
    assert not existing(metadata_uri, [entry.ledger_id])
    assert jobs(capsys, metadata_uri) == (0, [])


def test_ledger_jobs_text_output_names_the_abandoned_and_what_apply_does(base, driver, metadata_uri, capsys):
    job = driver("job")
    job.signal(signal.SIGKILL)
    gone(metadata_uri, job.driver_id)
    capsys.readouterr()
    assert ledger(["jobs", "--metadata", metadata_uri]) == 0
    out = capsys.readouterr().out
    assert job.owner in out and "abandoned" in out and "2 (1 open)" in out
    assert "1 abandoned (every driver gone): 2 ledgers" in out and "`ledger jobs --apply` deletes them" in out
    assert ledger(["jobs", "--metadata", metadata_uri, "--apply"]) == 0
    out = capsys.readouterr().out
    assert "cleaned: 2 ledgers deleted" in out and "cleaned 1 registries of gone drivers: 2 ledgers deleted" in out
