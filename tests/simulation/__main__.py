"""Run the simulation: python -m tests.simulation [--seed S] [--schedules N] [--minutes M] [--trace].

Schedules use seeds S, S+1, ... until N have run or M minutes passed. A violation prints the seed, what
broke and the schedule's trace, and the command that replays it; the exit status is 1 if any schedule
broke an invariant. The client iterates over sets of node ids, so a replay needs the same
PYTHONHASHSEED: this command re-runs itself with PYTHONHASHSEED=0 when it is not set.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from tests.simulation.schedule import run_schedule


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.simulation", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1, help="first seed (default 1)")
    parser.add_argument("--schedules", type=int, default=2000, help="how many schedules (default 2000)")
    parser.add_argument("--minutes", type=float, default=None, help="stop after this long, whatever is left")
    parser.add_argument("--trace", action="store_true", help="print every schedule's trace, not only failures")
    parser.add_argument("--max-violations", type=int, default=1, help="stop after this many failing schedules")
    args = parser.parse_args(argv)
    if args.schedules < 1 or (args.minutes is not None and args.minutes <= 0):
        parser.error("--schedules and --minutes must be positive")
    logging.disable(logging.CRITICAL)
    started = time.monotonic()
    deadline = started + args.minutes * 60 if args.minutes is not None else None
    ran = failed = acknowledged = closed = 0
    for seed in range(args.seed, args.seed + args.schedules):
        if deadline is not None and time.monotonic() > deadline:
            break
        outcome = run_schedule(seed)
        ran += 1
        acknowledged += outcome.acknowledged
        closed += outcome.recoveries_closed
        if outcome.violations or args.trace:
            print(f"--- seed {seed}: {len(outcome.violations)} violation(s)")
            print("\n".join(outcome.trace))
            for violation in outcome.violations:
                print(f"VIOLATION seed {seed}: {violation}")
        if outcome.violations:
            failed += 1
            print(f"replay: PYTHONHASHSEED=0 python -m tests.simulation --seed {seed} --schedules 1 --trace")
            if failed >= args.max_violations:
                break
    elapsed = time.monotonic() - started
    print(f"simulation: {ran} schedules from seed {args.seed}, {failed} with violations, "
          f"{acknowledged} acknowledged entries, {closed} closes checked, {elapsed:.1f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") is None:
        os.execve(sys.executable, [sys.executable, "-m", "tests.simulation", *sys.argv[1:]],
                  dict(os.environ, PYTHONHASHSEED="0"))
    sys.exit(main())
