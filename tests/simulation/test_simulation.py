"""The deterministic simulation in CI: a fixed budget of schedules from a fixed seed, a replay that repeats
itself exactly, and checks that can fail. A longer search: python -m tests.simulation --schedules 1000000."""
import os
import subprocess
import sys
import types

from metadata.model import Fragment, LedgerMetadata, LedgerState
from tests.simulation.invariants import check

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def simulate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.simulation", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, PYTHONHASHSEED="0"))


def test_two_thousand_schedules_keep_every_invariant():
    run = simulate("--seed", "1", "--schedules", "2000")
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    assert "2000 schedules from seed 1, 0 with violations" in run.stdout


def test_the_seed_that_found_a_write_back_publishing_a_lac_past_the_end_keeps_every_invariant():
    """Seed 6813 (found once range messages arrived each after its own delay, 2026-11-29): two recoveries at once, one
    writing back entries the other closed below; the write-back's piggybacked LAC left a node holding LAC 1 for a
    ledger closed at 0 (rules 12, 17). The write-back now carries the LAC its recovery started from."""
    run = simulate("--seed", "6813", "--schedules", "1")
    assert run.returncode == 0 and "0 with violations" in run.stdout, run.stdout[-20000:] + run.stderr[-5000:]


def test_a_seed_replays_exactly():
    first, second = simulate("--seed", "1252", "--schedules", "1", "--trace"), simulate(
        "--seed", "1252", "--schedules", "1", "--trace")
    assert first.returncode == 0 and "recovery attempt" in first.stdout
    assert first.stdout.splitlines()[:-1] == second.stdout.splitlines()[:-1]  # all but the timing line


def closed_at(last: int) -> LedgerMetadata:
    return LedgerMetadata(0, 3, 3, 2, (Fragment(0, ("a", "b", "c")),), state=LedgerState.CLOSED, last_entry_id=last)


def nodes(**lacs: int) -> types.SimpleNamespace:
    """A network whose nodes hold these LACs of ledger 0."""
    return types.SimpleNamespace(nodes={n: types.SimpleNamespace(lac={0: lac}) for n, lac in lacs.items()})


def test_the_checks_report_a_truncation_a_disagreement_out_of_order_acknowledgements_and_a_lac_beyond_the_end():
    scenario = types.SimpleNamespace(acks=[(0, 0.1), (2, 0.2), (1, 0.3)], closes=[("R1", 2), ("R2", 1)],
                                     network=nodes(a=1, b=2, c=0))
    violations = check(scenario, 0, closed_at(1))
    assert any(v.startswith("truncation: entry 2") for v in violations)
    assert any(v.startswith("disagreement: R1 closed the ledger at 2") for v in violations)
    assert any(v.startswith("acknowledgements out of order") for v in violations)
    assert [v for v in violations if v.startswith("LAC beyond")] == [
        "LAC beyond the end: node b holds LAC 2, the ledger closed at 1"]
    assert check(types.SimpleNamespace(acks=[(0, 0.1), (1, 0.2)], closes=[("R1", 1)], network=nodes(a=1, b=0)),
                 0, closed_at(1)) == []
