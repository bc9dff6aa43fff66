"""A Spark driver interrupted in the middle of an append (issue 15 item 7): what it leaves behind, and the
janitor that removes it (connector/spark/janitor.py), at the start of the next job on the stream or by
`ledger jobs --apply`; and a driver that is only paused, which nothing touches.

The driver is a Spark application of its own (tests/spark/janitor_job.py) in a process group of its own,
signalled as a terminal would (the whole group): SIGINT (Ctrl-C), SIGKILL, SIGSTOP/SIGCONT. It stands in
the middle of its append with two task ledgers closed and two OPEN.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from chispa import assert_df_equality

from connector.cli import main as ledger
from connector.client import LedgerClient
from connector.spark.jobs import job_registry, task_entries
from metadata import layout, registry
from metadata.store import MetadataStore
from metadata.streams import iter_ledgers, read_stream
from tests.harness.poll import poll_until
from tests.spark.helpers import REPO, read, stream_ledgers, write
from tests.spark.janitor_job import FAST_PARTITIONS, PARTITIONS

ROWS = 60_000  # 15 batches of 1000 per partition: the held partitions stop at their 10th


class InterruptedDriver:
    """python -m tests.spark.janitor_job in a process group of its own, and the job it stands in."""

    def __init__(self, uri: str, stream: str, tmp_path):
        self.uri = uri
        self.release = tmp_path / "release"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY_")}
        env["PYTHONPATH"] = str(REPO)
        self.log = tmp_path / "driver.log"
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.spark.janitor_job", uri, stream, str(ROWS), str(self.release)],
                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
            )
        self.job_id, self.ledgers = poll_until(self._in_flight, 240, interval=0.5, what="the append in flight")
        with MetadataStore(uri) as store:
            self.driver = store.read(job_registry(self.job_id).path, json.loads).value.get("driver", "")

    def _in_flight(self):
        """The job and its task ledgers once every partition has one and the fast ones are closed."""
        assert self.process.poll() is None, f"the driver exited: {self.log.read_text()[-3000:]}"
        with LedgerClient(self.uri) as lc:
            for job_id in lc.store.children(layout.SPARK_JOBS):
                ledgers = [e.ledger_id for e in task_entries(lc.store, job_registry(job_id))]
                if len(ledgers) < PARTITIONS or not all(lc.store.exists(layout.ledger_path(i)) for i in ledgers):
                    continue
                if sum(lc.ledger_metadata(i).is_closed for i in ledgers) == FAST_PARTITIONS:
                    return job_id, sorted(ledgers)
        return None

    def signal(self, signum: int) -> None:
        os.killpg(self.process.pid, signum)

    def wait(self) -> tuple[int, str]:
        out, _ = self.process.communicate(timeout=240)
        return self.process.returncode, out

    def stop(self) -> None:
        if self.process.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            self.process.wait(60)

    def wait_gone(self) -> None:
        """Until the driver's liveness registration is gone (its keeper saw the JVM end)."""
        if not self.driver:
            return  # a version that records no driver
        with MetadataStore(self.uri) as store:
            poll_until(lambda: not registry.writer_alive(store, self.driver), 60, interval=0.2,
                       what="the driver's registration to go")


@pytest.fixture
def driver(shared_uri, stream, tmp_path):
    started = []

    def start() -> InterruptedDriver:
        started.append(InterruptedDriver(shared_uri, stream, tmp_path))
        return started[-1]

    yield start
    for each in started:
        each.stop()


def rows(spark, first: int, count: int, tag: str):
    return spark.range(first, first + count, numPartitions=2).selectExpr("id", f"concat('{tag}', id) AS h")


def job_rows(spark):
    """What the interrupted driver appends when it is let finish."""
    return spark.range(0, ROWS).selectExpr("id", "sha2(cast(id as string), 256) AS h")


def left_behind(uri: str, job_id: str, ledgers: list[int]) -> tuple[bool, list[int]]:
    """Whether the job's registry is there, and which of its ledgers."""
    with MetadataStore(uri) as store:
        return store.exists(job_registry(job_id).path), [i for i in ledgers if store.exists(layout.ledger_path(i))]


def assert_stream_is(spark, uri: str, stream: str, expected) -> None:
    assert_df_equality(read(spark, uri, stream).orderBy("id"), expected.orderBy("id"), ignore_nullable=True)
    with MetadataStore(uri) as store:
        held = sorted(s.ledger_id for s in iter_ledgers(store, read_stream(store, stream).value))
    assert sorted(stream_ledgers(uri, stream)) == held  # no ledger of the stream left outside it


@pytest.mark.timeout(600)
def test_a_driver_interrupted_mid_append_leaves_nothing_once_the_next_job_starts(spark, shared_uri, stream, driver):
    base = rows(spark, -1000, 1000, "base-")
    write(base, shared_uri, stream)
    interrupted = driver()
    interrupted.signal(signal.SIGINT)  # Ctrl-C in the driver's terminal
    status, _ = interrupted.wait()
    assert status != 0
    # What it leaves: its job's registry and its task ledgers (two closed, two OPEN), which nothing removed.
    assert left_behind(shared_uri, interrupted.job_id, interrupted.ledgers) == (True, interrupted.ledgers)
    interrupted.wait_gone()

    following = rows(spark, 1_000_000, 500, "next-")
    write(following, shared_uri, stream)  # the next job on the stream: its start cleans what the other left
    assert left_behind(shared_uri, interrupted.job_id, interrupted.ledgers) == (False, [])
    assert_stream_is(spark, shared_uri, stream, base.union(following))


@pytest.mark.timeout(600)
def test_a_killed_drivers_leftovers_are_reported_and_deleted_by_ledger_jobs(
        spark, shared_uri, stream, driver, capsys):
    base = rows(spark, -1000, 1000, "base-")
    write(base, shared_uri, stream)
    killed = driver()
    killed.signal(signal.SIGKILL)
    killed.wait()
    assert left_behind(shared_uri, killed.job_id, killed.ledgers) == (True, killed.ledgers)
    killed.wait_gone()

    capsys.readouterr()
    assert ledger(["jobs", "--metadata", shared_uri, "--stream", stream, "--json"]) == 0
    [found] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (found["id"], found["state"], len(found["ledgers"])) == (killed.job_id, "abandoned", PARTITIONS)
    assert found["bytes"] > 0 and found["stored_bytes"] == 3 * found["bytes"]
    assert ledger(["jobs", "--metadata", shared_uri, "--stream", stream, "--apply", "--json"]) == 0
    [found] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(found["outcome"]["deleted"]) == killed.ledgers
    assert left_behind(shared_uri, killed.job_id, killed.ledgers) == (False, [])
    assert_stream_is(spark, shared_uri, stream, base)


@pytest.mark.timeout(600)
def test_a_paused_driver_is_never_cleaned_and_its_commit_lands_when_it_resumes(
        spark, shared_uri, stream, driver, capsys):
    base = rows(spark, -1000, 1000, "base-")
    write(base, shared_uri, stream)
    paused = driver()
    paused.signal(signal.SIGSTOP)  # the driver's JVM, Python and workers stand still
    paused_at = time.monotonic()
    following = rows(spark, 1_000_000, 500, "next-")
    write(following, shared_uri, stream)  # the next job's janitor leaves it
    # The janitor, run again and again for longer than a ZooKeeper session timeout (10 s), leaves it too.
    for _ in range(200):
        capsys.readouterr()
        assert ledger(["jobs", "--metadata", shared_uri, "--stream", stream, "--apply", "--json"]) == 0
        [found] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert (found["id"], found["state"]) == (paused.job_id, "running") and "outcome" not in found
        assert left_behind(shared_uri, paused.job_id, paused.ledgers) == (True, paused.ledgers)
        if time.monotonic() - paused_at > 15:
            break

    paused.signal(signal.SIGCONT)
    paused.release.write_text("go")
    status, out = paused.wait()
    assert status == 0 and f"committed {ROWS}" in out, paused.log.read_text()[-3000:]
    assert left_behind(shared_uri, paused.job_id, paused.ledgers) == (False, paused.ledgers)  # committed
    assert_stream_is(spark, shared_uri, stream, base.union(following).union(job_rows(spark)))
