"""CI's soak (issue 15 item 3): `ledger soak` for two minutes with a fixed seed finds nothing.

The whole run: five storage nodes, ZooKeeper, eight actor processes, the nemesis, then healing, recovery and
the checker. Longer runs with other seeds are for people (see the README's Soak section).
"""
from __future__ import annotations

import re

import pytest

from tests.soak.soak_run import soak_line

SEED = 15
MINUTES = 2
BUDGET = MINUTES * 60 + 300  # setup, stopping the actors, the final recovery and the check


@pytest.mark.timeout(BUDGET + 60)
def test_a_short_soak_with_a_fixed_seed_finds_no_violation(tmp_path):
    line = soak_line(tmp_path / "soak", MINUTES, SEED, BUDGET)
    assert "lost 0, duplicated 0, divergent 0, orphaned 0;" in line, line
    acked = int(re.search(r"\(acked (\d+),", line).group(1))
    faults = int(re.search(r"faults (\d+) by kind", line).group(1))
    assert acked > 1000 and faults >= 10, line  # the workload and the nemesis both ran
