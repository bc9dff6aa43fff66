"""`ledger bench {node,client,spark,stream,history}`: benchmarks that print ratios against a baseline
measured in the same run. Each benchmark module defines add_arguments(parser) and run(args)."""
from __future__ import annotations

import importlib

BENCHMARKS = {
    "node": ("connector.bench.node", "one storage node vs. an append+fsync loop on a plain file"),
    "client": ("connector.bench.client", "replicated writer (E=3, WQ=3, AQ=2) vs. a single node"),
    "spark": ("connector.bench.spark", "Spark ledger write/read vs. parquet"),
    "stream": ("connector.bench.stream", "streaming end-to-end latency and sink throughput"),
    "history": ("connector.bench.history", "commit, seek and read costs against a stream's history (rule 15)"),
}


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="run a benchmark")
    kinds = parser.add_subparsers(dest="benchmark", required=True)
    for name, (module_name, summary) in BENCHMARKS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            raise
        sub = kinds.add_parser(name, help=summary)
        module.add_arguments(sub)
        sub.set_defaults(func=module.run)
