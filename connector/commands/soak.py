"""`ledger soak`: a mixed workload against a nemesis on a local cluster, judged by a checker (connector/soak)."""
from __future__ import annotations

import math
import pathlib
import random

from connector.commands.arguments import directory
from connector.soak.run import Soak, default_directory, remove_cluster_data


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "soak", help="run writers, readers and a nemesis on a local 5-node cluster, then check the history")
    parser.add_argument("--minutes", type=float, default=5.0, help="how long the workload and the nemesis run "
                                                                   "(default 5); setup and the check come on top")
    parser.add_argument("--seed", type=int, help="seed of the nemesis and the workload (default: a random one, "
                                                 "printed); the same seed replays the same schedule of faults")
    parser.add_argument("--dir", type=directory,
                        help="a new or empty directory for the cluster, the histories and the trace (default: a "
                             "new temporary directory; its cluster data is removed after a run without violations)")
    parser.add_argument("--history", type=pathlib.Path, help="where to write the merged history "
                                                             "(default DIR/history.jsonl)")
    parser.add_argument("--spark", action="store_true",
                        help="also run Spark: a streaming query (rate source -> ledger sink) and a batch write "
                             "every ~30 s, checked for exactly-once output (needs chispa, in the test extra)")
    parser.set_defaults(func=run)


def run(args) -> int:
    if not 0 < args.minutes < math.inf:   # nan too
        raise SystemExit(f"ledger soak: --minutes {args.minutes} must be a finite number above 0")
    if args.spark:
        check_spark_installed()
    seed = args.seed if args.seed is not None else random.randrange(1, 1_000_000)
    directory = args.dir or default_directory()
    status = Soak(args.minutes, seed, directory, args.history, spark=args.spark).run()
    if status == 0 and args.dir is None:
        remove_cluster_data(directory)
    return status


def check_spark_installed() -> None:
    """--spark needs pyspark and chispa (its checker compares DataFrames with it): say so before starting."""
    import importlib.util

    missing = [name for name in ("pyspark", "chispa") if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(f"ledger soak --spark needs {' and '.join(missing)}: install them "
                         "(pip install -e '.[test]' brings both), or run the soak without --spark")
