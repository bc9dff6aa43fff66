"""Spark's pooled Python workers keep what they imported out of the collector's sight (connector/spark/worker_gc.py).

Each case runs in a fresh interpreter: gc.freeze is process-wide. A PySpark daemon worker is a process whose
__main__ is the module pyspark.daemon (`python -m pyspark.daemon`); the probe gives its __main__ that spec.
tests/spark/test_worker_gc.py checks the same in Spark's real workers.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]

PROBE = """
import gc, importlib.machinery, sys, weakref
gc.disable()   # only freeze_long_lived's own collection may free the cycle below
if {as_daemon}:
    sys.modules["__main__"].__spec__ = importlib.machinery.ModuleSpec("pyspark.daemon", None)
from connector.spark import worker_gc

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a
cycle = weakref.ref(a)
del a, b                                   # garbage that only a collection frees
first = worker_gc.freeze_long_lived()
frozen = gc.get_freeze_count()
made_since = [[n] for n in range(5000)]    # what the first task leaves, e.g. the client it opened
c, d = Node(), Node()
c.other, d.other = d, c
second_cycle = weakref.ref(c)
del c, d                                   # the first task's garbage, which the second freeze must not keep
second = worker_gc.freeze_long_lived()
frozen_second = gc.get_freeze_count()
third = worker_gc.freeze_long_lived()
print(first, second, third, cycle() is None and second_cycle() is None, frozen, frozen_second, gc.get_freeze_count(),
      len(gc.get_objects()))
"""


def _probe(as_daemon: bool, **env: str) -> list[str]:
    run = subprocess.run([sys.executable, "-c", PROBE.format(as_daemon=as_daemon)], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env={**os.environ, **env})
    assert run.returncode == 0, run.stderr
    return run.stdout.split()


def test_in_a_daemon_worker_the_first_call_collects_then_freezes_and_the_second_freezes_what_came_since():
    first, second, third, collected, frozen, frozen_second, frozen_after, tracked = _probe(as_daemon=True)
    assert (first, second, third) == ("True", "True", "False")     # twice per worker
    assert collected == "True"                      # garbage is collected first, never frozen (both times)
    assert int(frozen) > 1000
    assert int(frozen_second) >= int(frozen) + 5000 and frozen_after == frozen_second
    assert int(tracked) < 100                       # what a collection still walks: only what came after


def test_anywhere_else_the_collector_is_left_alone():
    first, second, third, collected, frozen, _, _, _ = _probe(as_daemon=False)
    assert (first, second, third, collected, frozen) == ("False", "False", "False", "False", "0")


def test_the_switch_turns_it_off_in_a_daemon_worker_too():
    first, second, third, collected, frozen, _, _, _ = _probe(as_daemon=True, LEDGER_WORKER_GC_FREEZE="off")
    assert (first, second, third, collected, frozen) == ("False", "False", "False", "False", "0")
