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
second = worker_gc.freeze_long_lived()
print(first, second, cycle() is None, frozen, gc.get_freeze_count(), len(gc.get_objects()))
"""


def _probe(as_daemon: bool, **env: str) -> list[str]:
    run = subprocess.run([sys.executable, "-c", PROBE.format(as_daemon=as_daemon)], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env={**os.environ, **env})
    assert run.returncode == 0, run.stderr
    return run.stdout.split()


def test_in_a_daemon_worker_the_first_call_collects_then_freezes_what_is_tracked():
    first, second, collected, frozen, frozen_after, tracked = _probe(as_daemon=True)
    assert (first, second) == ("True", "False")     # once per worker
    assert collected == "True"                      # garbage is collected first, never frozen
    assert int(frozen) > 1000 and frozen_after == frozen
    assert int(tracked) < 100                       # what a collection still walks: only what came after


def test_anywhere_else_the_collector_is_left_alone():
    first, second, collected, frozen, _, _ = _probe(as_daemon=False)
    assert (first, second, collected, frozen) == ("False", "False", "False", "0")


def test_the_switch_turns_it_off_in_a_daemon_worker_too():
    first, second, collected, frozen, _, _ = _probe(as_daemon=True, LEDGER_WORKER_GC_FREEZE="off")
    assert (first, second, collected, frozen) == ("False", "False", "False", "0")
