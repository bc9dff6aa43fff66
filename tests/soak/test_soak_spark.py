"""CI's Spark soak (issue 15 item 2, --spark): `ledger soak --spark` for one minute with a fixed seed finds nothing.

On top of the plain soak's cluster, actors and nemesis: a Spark actor (its own process, one local SparkSession)
running a streaming query, rate source -> ledger sink, and a batch write, then the checker reading the stream
back with Spark and comparing it with chispa. The checker's Spark verdicts are tested by hand in
test_checker.py; this runs the whole thing.
"""
from __future__ import annotations

import json
import re

import pytest

from connector.soak.run import SPARK_START_SECONDS
from tests.soak.soak_run import soak_line

SEED = 15
MINUTES = 1
BUDGET = MINUTES * 60 + 420 + SPARK_START_SECONDS  # setup, the Spark session (the timed run waits for its query), stopping the actors (the query's drain), the check


@pytest.mark.timeout(BUDGET + 60)
def test_a_short_spark_soak_with_a_fixed_seed_finds_no_violation(tmp_path):
    directory = tmp_path / "soak"
    line = soak_line(directory, MINUTES, SEED, BUDGET, "--spark")
    assert "lost 0, duplicated 0, divergent 0, orphaned 0; spark rows " in line, line
    rows, batches, restarts = (int(n) for n in re.search(
        r"; spark rows (\d+) \(batches (\d+), query restarts (\d+)\);", line).groups())
    assert rows >= 1000, line  # the streaming query ran (100 rows a second)
    history = [json.loads(record) for record in (directory / "history.jsonl").read_text().splitlines()]
    spark_ops = {r["op"] for r in history if r["actor"].startswith("spark.")}
    assert {"query-start", "spark-batch"} <= spark_ops, spark_ops  # both the query and a batch write ran
    drains = [r for r in history if r["op"] == "query-end" and r.get("error") == "drained"]
    assert drains, "the Spark actor did not drain its query at the end"
