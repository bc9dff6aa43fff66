"""The nemesis's spark-driver-kill against a real process group standing in for the Spark actor: it kills a driver
only once the driver's query committed a micro-batch and no batch write is in flight, and starts a replacement.

Before, it struck once the query had started: on a loaded machine a driver (and its replacement, 30 s or more to
start) killed before its first micro-batch left CI's one-minute Spark soak with no Spark rows ("spark rows 0")."""
from __future__ import annotations

import json
import random
import signal
import sys

import pytest

from connector.soak.nemesis import Nemesis
from connector.soak.run import SPARK_SLOT, ActorProcess, Soak

# The actor's process: it only has to be alive until the nemesis or the fixture kills its group (no test waits on
# it); the 120 s bound only keeps a leaked one from outliving its test run.
STAND_IN = [sys.executable, "-c", "import time; time.sleep(120)"]


class _Soak:
    """What the nemesis asks of a soak for this fault, with the soak's own replace()."""

    spark = True
    replace = Soak.replace

    def __init__(self, actor: ActorProcess):
        self.actor = actor

    def spark_actor(self) -> ActorProcess:
        return self.actor

    def _actor_command(self, slot: str) -> list[str]:
        return STAND_IN


@pytest.fixture
def driver(tmp_path):
    actor = ActorProcess(SPARK_SLOT, "spark", [], tmp_path, group=True)
    actor.start(STAND_IN)
    yield actor
    actor.signal(signal.SIGKILL)
    actor.process.wait(10)


def publish(actor: ActorProcess, **status) -> None:
    status = {"actor": actor.name, "role": "spark", "batch": None, "query": "q", "progressed": False, **status}
    (actor.directory / f"{actor.name}.status.json").write_text(json.dumps(status))


def test_a_driver_is_killed_only_once_its_query_committed_a_micro_batch(driver, tmp_path):
    nemesis = Nemesis(_Soak(driver), random.Random(1), tmp_path / "nemesis.log")
    first = driver.process
    publish(driver)   # the query started, no micro-batch committed yet

    assert nemesis._spark_driver_kill() is None
    assert first.poll() is None

    publish(driver, progressed=True, batch="spark.1/0/1000")   # a batch write in flight
    assert nemesis._spark_driver_kill() is None
    assert first.poll() is None

    publish(driver, progressed=True)
    fault = nemesis._spark_driver_kill()

    assert (fault.kind, fault.detail) == ("spark-driver-kill", {"actor": "spark.1", "replacement": "spark.2"})
    assert first.wait(10) == -signal.SIGKILL
    assert driver.process is not first and driver.process.poll() is None
    assert nemesis._spark_driver_kill() is None   # the replacement has published nothing yet
