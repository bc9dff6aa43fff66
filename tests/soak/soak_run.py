"""Run `ledger soak` as CI does: a subprocess with a budget, stopped with SIGINT (it stops its cluster and actors
on the way out) if it overruns; its last output line (the figures) once it exited 0."""
from __future__ import annotations

import pathlib
import signal
import subprocess
import sys

import pytest


def soak_line(directory: pathlib.Path, minutes: int, seed: int, budget: float, *extra: str) -> str:
    soak = subprocess.Popen(
        [sys.executable, "-m", "connector.cli", "soak", "--minutes", str(minutes), "--seed", str(seed), *extra,
         "--dir", str(directory)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        out, err = soak.communicate(timeout=budget)
    except subprocess.TimeoutExpired:
        soak.send_signal(signal.SIGINT)
        out, err = soak.communicate(timeout=60)
        pytest.fail(f"the soak did not end within {budget}s:\n{out}\n{err[-5000:]}")
    assert soak.returncode == 0, f"{out}\n{err[-5000:]}"
    line = out.strip().splitlines()[-1]
    assert line.startswith(f"soak: {minutes} minutes, seed {seed}, ops "), line
    return line
