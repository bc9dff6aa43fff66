"""The Spark benchmarks run end to end on tiny settings and print their figure lines (speed is not asserted)."""
from __future__ import annotations

import re

from tests.harness.bench import NUMBER, bench


def test_spark_bench_prints_write_read_and_ceiling_figures():
    out = bench("spark", "--rows", "20000", "--runs", "1", "--small-ledgers", "10", "--small-rows", "5")
    for case in ("write", "count", "group-by"):
        assert re.search(rf"{case} +ledger +{NUMBER}s .* ledger/parquet throughput {NUMBER}x", out), out
    assert re.search(rf"ceiling .* write {NUMBER}s = {NUMBER}x parquet, count {NUMBER}s = {NUMBER}x parquet, "
                     rf"group-by {NUMBER}s = {NUMBER}x parquet", out), out
    assert re.search(rf"cold +write {NUMBER}x parquet's first run .* group-by first/best {NUMBER}", out), out
    assert re.search(rf"cold ceiling, .*: write first {NUMBER}s, best {NUMBER}s, first/best {NUMBER}, "
                     rf"{NUMBER}x parquet's first run; count first {NUMBER}s, best {NUMBER}s, first/best {NUMBER}; "
                     rf"group-by first", out), out
    assert re.search(rf"vs ceiling .* write {NUMBER} \(>= 0.7\).*; count {NUMBER} \(>= 0.8\).*; group-by {NUMBER}",
                     out), out
    split = (rf"{NUMBER}s: JVM {NUMBER} \+ Python workers {NUMBER} \+ nodes {NUMBER} \+ ZooKeeper {NUMBER} = {NUMBER} "
             rf"CPU s, {NUMBER} of \d+ cores")
    for case in ("write", "count", "group-by"):
        replicated = rf"; replicated ceiling {split}" if case == "write" else ""
        assert re.search(rf"cpu {case} +ledger {split}; ceiling {split}{replicated}; parquet {split}", out), out
    assert re.search(rf"replicated ceiling: .* write {NUMBER}s; ledger time / it {NUMBER}", out), out
    assert re.search(rf"small ledgers: a count of 10 ledgers of 5 rows .*: packed into 2 partitions {NUMBER}s, one "
                     rf"partition per ledger {NUMBER}s; {NUMBER}x faster", out), out


def test_stream_bench_prints_latency_throughput_and_commit_figures():
    out = bench("stream", "--entries", "20", "--rate", "20", "--warm-up-seconds", "0", "--sparse-entries", "2",
                "--sparse-rate", "10", "--rows", "5000",
                "--unrelated", "50", "--commit-batches", "2", "--sink-seconds", "3", "--sink-rate", "2000",
                "--sink-fast-rate", "20000")
    latency = rf"p50 {NUMBER} ms, p99 {NUMBER} ms; ceiling .* p50 {NUMBER} ms, p99 {NUMBER} ms; p50 ratio {NUMBER}"
    assert re.search(rf"stream latency: .* {latency}.*first row after its start {NUMBER} ms", out), out
    assert re.search(rf"stream latency, a sparse stream: .* entries at 10/s: {latency}", out), out
    assert re.search(rf"ledger {NUMBER} rows/s, parquet {NUMBER} rows/s, ratio {NUMBER} .* median batch ledger "
                     rf"{NUMBER} ms, parquet {NUMBER} ms, ratio {NUMBER}", out), out
    assert re.search(rf"{NUMBER} rows/s", out), out
    assert re.search(rf"sink commit: .* {NUMBER} ms on a fresh cluster, {NUMBER} ms with 50 unrelated ledgers; ratio {NUMBER}", out), out
