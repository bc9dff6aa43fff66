"""Run `ledger bench ...` in a subprocess for the smoke tests of the benchmarks."""
from __future__ import annotations

import subprocess
import sys

NUMBER = r"[\d,.]+"


def bench(*args: str, timeout: float = 300) -> str:
    """The benchmark's stdout; fails if it crashed. Exit 1 (a target missed) is a speed question, not a failure."""
    done = subprocess.run([sys.executable, "-m", "connector.cli", "bench", *args], capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode in (0, 1), f"bench {args[0]} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout
