"""The benchmarks run end to end on tiny settings and print their figure lines (speed is not asserted)."""
from __future__ import annotations

import re

import pytest

from tests.harness.bench import NUMBER, bench


@pytest.mark.parametrize("args,lines", [
    (("node", "--seconds", "0.3", "--warmup", "0.1"),
     [rf"node 1KiB: {NUMBER} entries/s .* ratio {NUMBER}", rf"node 1MiB: {NUMBER} entries/s .* ratio {NUMBER}",
      rf"cpu per acknowledged entry: node {NUMBER} us .* driver {NUMBER} us .* at one full core: {NUMBER} entries/s",
      rf"ceiling \(a Python gRPC server that only writes, fdatasyncs and answers; node_ceiling.py\): {NUMBER} "
      rf"entries/s {NUMBER} MB/s, ratio {NUMBER} to the raw file, server {NUMBER} \+ driver {NUMBER} cores; the node "
      rf"reaches {NUMBER} of it",
      r"target 1MiB >= 80% of raw fsynced-file MB/s: MB/s ratio [\d.]+, (met|MISSED|MISSED, bound on this machine: "
      r"the ceiling reaches [\d.]+)$"]),
    (("client", "--seconds", "0.3", "--warmup", "0.1", "--recovery-lengths", "10,200"),
     [rf"client 1KiB: replicated .* ratio {NUMBER}", rf"client 1MiB: replicated .* ratio {NUMBER}",
      rf"ceiling \(node_ceiling.py: Python gRPC servers that only write, fdatasync and answer; one sender\): to "
      rf"three, acknowledged by two, {NUMBER}/s \(servers {NUMBER} \+ sender {NUMBER} cores\), {NUMBER} of the single "
      rf"node; to one {NUMBER}/s \(server {NUMBER} \+ sender {NUMBER} cores\)",
      r"client 1MiB: .* \(target >= 0.50: (met|MISSED|MISSED, bound on this machine: the ceiling to three reaches "
      r"[\d.]+ of the single node)\)$",
      rf"cpu replicated: nodes {NUMBER} \+ client {NUMBER} of \d+ cores; {NUMBER} ms per acknowledged MB; "
      rf"per acknowledged entry: nodes {NUMBER} us \+ client {NUMBER} us",
      rf"client 1KiB in batches of 128 \(append_many\): replicated E=3 WQ=3 AQ=2 {NUMBER} appends/s \(target >= "
      rf"75,000: (met|MISSED)\); per acknowledged entry: nodes {NUMBER} us \+ client {NUMBER} us; bound at \d+ "
      rf"cores: {NUMBER} appends/s \(the nodes' CPU alone: {NUMBER}\)",
      rf"recovery of an OPEN ledger: 10 entries {NUMBER} ms, 200 entries {NUMBER} ms; ratio longest/shortest "
      rf"{NUMBER} \(must not grow with length\); medians of 3"]),
    (("history", "--quick"),
     [rf"sink commit: .* {NUMBER} ms on an empty stream .* {NUMBER} ms on a stream of 2,000 ledgers .* ratio {NUMBER}",
      rf"batch write commit: .* ratio {NUMBER}",
      rf"seek: a streaming micro-batch of one row, .* at the first row .* at its last row; ratio {NUMBER}",
      rf"without its row index \(binary search\): {NUMBER} ms; planned from the first entry .*: {NUMBER} ms",
      rf"compaction: a batch read of 100 sink-sized ledgers .*: {NUMBER}s, {NUMBER} rows/s",
      rf"compact: not available|compaction: the same rows after compact .*: {NUMBER}s, {NUMBER} rows/s",
      rf"node: a garbage-collection round's compaction planning .*, ([1-9][\d,]*) and \1 records to move "
      rf"\(segments of 25 MiB\): {NUMBER} ms on a node of 100,096 entries, {NUMBER} ms on one of 1,000,064; ratio "
      rf"{NUMBER} \(target <= 1.3: (met|MISSED)\)",
      rf"node: a checkpoint after 12,800 new entries in 100 ledgers, a delta of ([\d,]+) and \1 bytes, encoded on "
      rf"the event loop: {NUMBER} ms on a node of 100,096 entries, {NUMBER} ms on one of 1,000,064; ratio {NUMBER}",
      rf"node: a whole snapshot .*: {NUMBER} ms \({NUMBER} bytes\) and {NUMBER} ms \({NUMBER} bytes\); on the "
      rf"larger node one in every {NUMBER} checkpoints of this delta's size, {NUMBER} ms each amortised"]),
])
def test_bench_prints_its_figures(args, lines):
    out = bench(*args)
    for line in lines:
        assert re.search(line, out, re.MULTILINE), f"no line matching {line!r} in:\n{out}"
