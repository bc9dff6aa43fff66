"""The ceiling's cases of `ledger bench spark` in a Spark application of their own, as a first query pays them.

`python -m connector.bench.cold_ceiling --rows N ...` starts a new local SparkSession, caches the sample rows and
writes them to parquet (as the benchmark does before its first Python Data Source query, so the JVM is as warm),
then times the ceiling's write, count and group-by (connector/bench/ceiling.py) in --runs rounds and prints one
JSON line: case -> [best, first] seconds. The first runs pay what any Python Data Source pays in a new
application: Spark starting its Python planning and executor workers, and the JVM's first pass over the Python
Data Source paths. `ledger bench spark` runs it and prints it as the bound for its first-run targets.
"""
from __future__ import annotations

import argparse
import json
import pathlib

from connector.bench.spark import bench_session, ceiling_read, ceiling_write, grouped, timed_rounds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m connector.bench.cold_ceiling")
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=int, default=None)
    parser.add_argument("--entry-bytes", type=int, default=1024 * 1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=pathlib.Path, required=True, help="where the parquet copy goes")
    args = parser.parse_args(argv)

    from connector.demo.sample import sample_dataframe

    spark = bench_session(args.master, "ledger-bench-cold-ceiling")
    try:
        df = sample_dataframe(spark, args.rows, partitions=args.partitions).cache()
        df.count()
        df.write.mode("overwrite").parquet(str(args.dir / "parquet"))
        reader = ceiling_read(spark, args.rows, df.rdd.getNumPartitions(), args.entry_bytes)
        times = timed_rounds({
            "write": ceiling_write(df),
            "count": lambda: reader().count(),
            "group-by": lambda: grouped(reader()),
        }, args.runs)
    finally:
        spark.stop()
    print(json.dumps({case: [timed.best, timed.first] for case, timed in times.items()}))


if __name__ == "__main__":
    main()
