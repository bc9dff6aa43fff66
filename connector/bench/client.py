"""`ledger bench client`: the replicated writer (E=3, WQ=3, AQ=2) beside a single node (E=WQ=AQ=1).

Starts a real ZooKeeper and three `python -m storage_node` processes (fsync on) in a temporary directory.
One LedgerClient appends with many adds in flight (append_async, a bounded window), first to a one-node
ledger, then to a replicated one, for 1 KiB and 1 MiB entries, and prints the ratios measured in this run.
Then it times the recovery of OPEN ledgers of 1,000 and 100,000 entries (the median of --recovery-repeats ledgers
of each length: one recovery takes milliseconds, within a machine's hiccups): recovery starts at the LAC, so its
time must not grow with the ledger's length.

Beside each figure it prints the CPU the nodes and the client used (in cores), per acknowledged MB and per
acknowledged entry (all three nodes' CPU together, and the client's):
a replicated add moves every byte through three nodes and out of the client three times, so once the
machine's cores are saturated the ratio is bounded by the two cases' CPU per MB, not by the protocol. For 1 MiB
entries (each travels in a message of its own) it measures that bound between the single and replicated runs: the
node ceiling (connector/bench/node_ceiling.py: Python gRPC servers that only write what they receive, fdatasync
and answer), one sender to three of them acknowledged by two, and to one. Where three copies through the ceiling
miss the target against the single node measured, no writer and nodes on Python's gRPC reach it on this machine.

Small events (issue 17): 1 KiB entries handed over in batches (`append_many_async`, --small-batch entries a
call), as a producer of small events sends them, replicated E=3 WQ=3 AQ=2, against the target of 75,000
appends/s. Beside it, the bound this run measured: an acknowledged entry cost the nodes and the client
together C CPU seconds, so this machine's cores allow at most cores / C appends/s, however the work is spread
(and the nodes' share alone, with a client that cost nothing, allows cores / their share).
"""
from __future__ import annotations

import collections
import os
import pathlib
import statistics
import tempfile
import time

from connector.bench.cpu import CpuClock
from connector.bench.node_ceiling import CeilingServer, measure, verdict
from connector.client import LedgerClient
from connector.commands.arguments import directory, positive, seconds, seconds_or_zero
from connector.node_launcher import NodeHandle, launch, node_command, wait_all_ready
from metadata.embedded import EmbeddedZooKeeper
from metadata.store import initialise_root

KiB = 1024
MiB = 1024 * KiB
TARGET_RATIO = 0.50
TARGET_SMALL_EVENTS_PER_S = 75_000
NODE_START_SECONDS = 60.0


def add_arguments(parser) -> None:
    parser.add_argument("--dir", type=directory, default=None, help="where ZooKeeper and the nodes keep their data "
                                                   "(default: the system temp directory)")
    parser.add_argument("--seconds", type=seconds, default=5.0, help="measured time per case")
    parser.add_argument("--warmup", type=seconds_or_zero, default=1.0, help="unmeasured time before each case")
    parser.add_argument("--small-window", type=positive, default=2000, help="1 KiB adds in flight")
    parser.add_argument("--large-window", type=positive, default=32, help="1 MiB adds in flight")
    parser.add_argument("--small-batch", type=positive, default=128,
                        help="1 KiB entries per append_many call in the small-events case")
    parser.add_argument("--recovery-lengths", type=_lengths, default="1000,100000",
                        help="entries of the OPEN ledgers recovered")
    parser.add_argument("--recovery-repeats", type=positive, default=3,
                        help="OPEN ledgers recovered per length (the median is printed)")


def _lengths(text: str) -> list[int]:
    """--recovery-lengths: comma-separated entry counts, each a positive integer."""
    return [positive(length.strip()) for length in text.split(",")]


def run(args) -> int:
    base = pathlib.Path(args.dir or tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base, prefix="ledger-bench-client-") as tmp:
        work = pathlib.Path(tmp)
        with EmbeddedZooKeeper(work / "zookeeper") as zk:
            uri = zk.uri("/bench")
            initialise_root(uri)
            nodes: list[NodeHandle] = []
            ceilings: list[CeilingServer] = []
            try:
                for i in range(1, 4):     # one at a time: each one started is stopped below, whatever fails
                    nodes.append(launch(node_command(work / f"node-{i}", 0, uri, f"node-{i}"), f"node-{i}"))
                wait_all_ready(nodes, NODE_START_SECONDS)
                for i in range(1, 4):
                    ceilings.append(CeilingServer(work / f"ceiling-{i}"))
                with LedgerClient(uri, timeout=10.0, add_timeout=30.0) as client:
                    clock = CpuClock([node.pid for node in nodes])
                    for label, size, window in (("1KiB", KiB, args.small_window), ("1MiB", MiB, args.large_window)):
                        _compare(client, clock, label, size, window, args, ceilings if size >= MiB else None)
                    _small_events(client, clock, args)
                    lengths = args.recovery_lengths
                    repeats = max(1, args.recovery_repeats)
                    times = [statistics.median(_recovery_time(client, uri, n) for _ in range(repeats))
                             for n in lengths]
                    print("recovery of an OPEN ledger: " + ", ".join(
                        f"{n:,} entries {t * 1000:,.0f} ms" for n, t in zip(lengths, times))
                        + f"; ratio longest/shortest {times[-1] / times[0]:.2f} (must not grow with length); "
                        f"medians of {repeats}", flush=True)
            finally:
                for process in (*nodes, *ceilings):
                    process.stop()
    return 0


def _compare(client: LedgerClient, clock: CpuClock, label: str, size: int, window: int, args,
             ceilings: list[CeilingServer] | None = None) -> None:
    """The replicated writer against a single node; with `ceilings` (three node ceiling servers), in between, the
    ceiling's sender to three of them (acknowledged by two), the most any writer and nodes on Python's gRPC
    replicate here, and to one. The target is bound when three copies through the ceiling miss it against the
    single node measured."""
    single, single_cpu = _throughput(client, clock, (1, 1, 1), size, window, args)
    if ceilings:
        one = measure(ceilings[:1], 1, size, 1, window, args.warmup, args.seconds)
        three = measure(ceilings, 2, size, 1, window, args.warmup, args.seconds)
    replicated, replicated_cpu = _throughput(client, clock, (3, 3, 2), size, window, args)
    ratio = replicated / max(single, 1e-9)     # 0 only on a machine too slow for --seconds
    if ceilings:
        ceiling_ratio = three.entries_per_s / max(single, 1e-9)
        outcome = verdict(ratio, TARGET_RATIO, ceiling_ratio,
                          f"to three reaches {ceiling_ratio:.2f} of the single node")
    else:
        outcome = verdict(ratio, TARGET_RATIO)
    print(f"client {label}: replicated E=3 WQ=3 AQ=2 {replicated:,.0f} appends/s {replicated * size / 1e6:,.1f} MB/s; "
          f"single node {single:,.0f} appends/s {single * size / 1e6:,.1f} MB/s; ratio {ratio:.2f} "
          f"(target >= {TARGET_RATIO:.2f}: {outcome})", flush=True)
    for name, rate, (nodes, own) in (("replicated", replicated, replicated_cpu), ("single", single, single_cpu)):
        mb = max(rate * size / 1e6, 1e-9)
        print(f"  cpu {name:<10}: nodes {nodes:.2f} + client {own:.2f} of {os.cpu_count()} cores; "
              f"{(nodes + own) * 1000 / mb:.2f} ms per acknowledged MB; {_per_entry(nodes, own, rate)}", flush=True)
    if ceilings:
        print(f"  ceiling (node_ceiling.py: Python gRPC servers that only write, fdatasync and answer; one sender): "
              f"to three, acknowledged by two, {three.entries_per_s:,.0f}/s (servers {three.server_cores:.2f} + "
              f"sender {three.driver_cores:.2f} cores), {ceiling_ratio:.2f} of the single node; to one "
              f"{one.entries_per_s:,.0f}/s (server {one.server_cores:.2f} + sender {one.driver_cores:.2f} cores)",
              flush=True)


def _per_entry(nodes: float, own: float, rate: float) -> str:
    """The nodes' and the client's CPU (cores) over an acknowledged rate, per acknowledged entry."""
    rate = max(rate, 1e-9)
    return f"per acknowledged entry: nodes {nodes * 1e6 / rate:,.1f} us + client {own * 1e6 / rate:,.1f} us"


def _small_events(client: LedgerClient, clock: CpuClock, args) -> None:
    rate, (nodes, own) = _throughput(client, clock, (3, 3, 2), KiB, args.small_window, args, batch=args.small_batch)
    cores = os.cpu_count() or 1
    bound = cores * rate / max(nodes + own, 1e-12)        # every core busy at the CPU an entry cost here
    nodes_bound = cores * rate / max(nodes, 1e-12)        # the nodes' CPU alone, with a client for free
    verdict = "met" if rate >= TARGET_SMALL_EVENTS_PER_S else "MISSED"
    print(f"client 1KiB in batches of {args.small_batch} (append_many): replicated E=3 WQ=3 AQ=2 {rate:,.0f} appends/s "
          f"(target >= {TARGET_SMALL_EVENTS_PER_S:,}: {verdict}); {_per_entry(nodes, own, rate)}; "
          f"bound at {cores} cores: {bound:,.0f} appends/s (the nodes' CPU alone: {nodes_bound:,.0f})", flush=True)


def _throughput(client: LedgerClient, clock: CpuClock, quorums: tuple[int, int, int], size: int, window: int,
                args, batch: int = 1) -> tuple[float, tuple[float, float]]:
    """Acknowledged appends per second with about `window` adds in flight (handed over `batch` at a time:
    append_async one by one, or append_many_async), after a warmup, and the cores the nodes and the client
    used meanwhile."""
    payload = os.urandom(size)
    payloads = [payload] * batch
    calls = max(1, window // batch)
    writer = client.create_ledger(*quorums)
    in_flight: collections.deque = collections.deque()
    start = time.perf_counter()
    measure_from = start + args.warmup
    end = measure_from + args.seconds
    counted = 0
    cpu_from = None
    while True:
        now = time.perf_counter()
        if now >= end:
            cpu_to = clock.read()
            cpu_from = cpu_from or cpu_to     # a machine so slow that no add ended in the measured time
            break
        if cpu_from is None and now >= measure_from:
            cpu_from = clock.read()
        while len(in_flight) < calls:
            in_flight.append(writer.append_async(payload) if batch == 1 else writer.append_many_async(payloads))
        in_flight.popleft().result()
        if now >= measure_from:
            counted += batch
    for future in in_flight:
        future.result()
    writer.close()
    client.delete_ledger(writer.ledger_id)
    cores = tuple((to - fro) / args.seconds for to, fro in zip(cpu_to, cpu_from))
    return counted / args.seconds, cores


def _recovery_time(client: LedgerClient, uri: str, entries: int) -> float:
    """Seconds to recover an OPEN ledger of `entries` 100-byte entries whose writer stopped writing."""
    with LedgerClient(uri) as writer_client:
        writer = writer_client.create_ledger(3, 3, 2)
        payload = os.urandom(100)
        in_flight: collections.deque = collections.deque()
        for _ in range(entries):
            in_flight.append(writer.append_async(payload))
            if len(in_flight) >= 2000:
                in_flight.popleft().result()
        for future in in_flight:
            future.result()
        started = time.perf_counter()
        meta = client.recover_ledger(writer.ledger_id)
        elapsed = time.perf_counter() - started
    if meta.last_entry_id != entries - 1:
        raise SystemExit(f"bench: recovery closed ledger {meta.ledger_id} at {meta.last_entry_id}, "
                         f"expected {entries - 1}")
    client.delete_ledger(meta.ledger_id)
    return elapsed
