"""`ledger bench node`: one storage node with fsync on, beside this machine's raw fsync limit.

Starts a real ZooKeeper and one node process in a temporary directory, then keeps many entries in
flight on one Add stream (several entries per AddRequest) for 1 KiB and 1 MiB entries. In the same
run and directory it measures an append+fsync loop on a plain file with the same entry size and the
same group size (entries per fsync that the node achieved), and the node ceiling (connector/bench/node_ceiling.py:
a Python gRPC server that only writes what it receives, fdatasyncs and answers) with the same messages, and
prints the ratios, and the CPU the node process (all its threads) and this driver used per acknowledged entry over
the measured seconds: the node's figure at one full core bounds its rate on any machine like this one, whatever
else shares the cores. A target the ceiling misses as well is bound on this machine: no node on Python's gRPC
reaches it here.
The node runs as its own process (connector/node_launcher.py): the connector never imports it, so the page
cache allowance the raw loop imitates is one this module owns and passes to the node as a flag. The ledgers it writes
are created in ZooKeeper first, as a writer's are: the node binds a ledger's key only once its metadata names it.
"""
from __future__ import annotations

import asyncio
import os
import pathlib
import tempfile
import time

import grpc

from connector.bench.cpu import CpuClock
from connector.bench.node_ceiling import CeilingServer, SyncedFile, measure, verdict
from connector.commands.arguments import directory, positive, seconds, seconds_or_zero
from connector.node_launcher import node_command, start_node
from metadata.embedded import EmbeddedZooKeeper
from metadata.model import Fragment, LedgerMetadata
from metadata.store import MetadataStore, initialise_root
from protos import ledger_pb2 as pb
from protos import ledger_pb2_grpc
from protos import wire
from protos.digest import entry_digest, master_key, password_hash

KiB = 1024
MiB = 1024 * KiB
_MAX_MESSAGE = 256 * MiB
TARGET_SMALL_ENTRIES_PER_S = 250_000
TARGET_LARGE_RATIO = 0.80
_PAGE_CACHE_BYTES = 0            # the node's default --journal-page-cache-bytes, passed to it explicitly
_PASSWORD = b"bench"
NODE_ID = "bench-node"
NODE_START_SECONDS = 60.0


def add_arguments(parser) -> None:
    parser.add_argument("--dir", type=directory, default=None, help="where to put ZooKeeper, the node and the raw file "
                                                   "(default: the system temp directory)")
    parser.add_argument("--seconds", type=seconds, default=3.0,
                        help="measured time of each of the two node and two raw runs per case")
    parser.add_argument("--warmup", type=seconds_or_zero, default=1.0, help="unmeasured time before each case")
    parser.add_argument("--small-batch", type=positive, default=128, help="1 KiB entries per AddRequest")
    parser.add_argument("--small-window", type=positive, default=4096, help="1 KiB entries in flight")
    parser.add_argument("--large-batch", type=positive, default=1, help="1 MiB entries per AddRequest")
    parser.add_argument("--large-window", type=positive, default=32, help="1 MiB entries in flight")


def run(args) -> int:
    base = pathlib.Path(args.dir or tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base, prefix="ledger-bench-node-") as tmp:
        work = pathlib.Path(tmp)
        with EmbeddedZooKeeper(work / "zookeeper") as zk:
            initialise_root(zk.uri("/bench"))
            node = _NodeUnderTest(work / "node", zk.uri("/bench"))
            with MetadataStore(zk.uri("/bench")) as store:
                ledgers = [_create_ledger(store) for _ in range(2)]
            ceiling = None
            try:
                ceiling = CeilingServer(work / "ceiling")
                cases = [
                    ("1KiB", KiB, args.small_batch, args.small_window),
                    ("1MiB", MiB, args.large_batch, args.large_window),
                ]
                for ledger_ids, (label, size, batch, window) in zip(ledgers, cases):
                    _compare(node, ceiling, work, label, ledger_ids, size, batch, window, args)
            finally:
                node.stop()
                if ceiling is not None:
                    ceiling.stop()
    return 0


def _create_ledger(store: MetadataStore) -> tuple[int, int]:
    """Two ledgers of the node alone (one per node run of a case), created as a writer creates them."""
    meta = LedgerMetadata(0, 1, 1, 1, (Fragment(0, (NODE_ID,)),), password_hash=password_hash(_PASSWORD))
    return store.create_ledger(meta).value.ledger_id, store.create_ledger(meta).value.ledger_id


def _compare(node: "_NodeUnderTest", ceiling: CeilingServer, work: pathlib.Path, label: str,
             ledger_ids: tuple[int, int], size: int, batch: int, window: int, args) -> None:
    clock = CpuClock([node.pid])
    before = node.info()
    acked, elapsed, cpu = asyncio.run(_drive(node.address, ledger_ids[0], size, batch, window, args.warmup,
                                             args.seconds, clock))
    after = node.info()
    fsyncs = max(1, after.journal_fsyncs - before.journal_fsyncs)
    group = max(1, round((after.journal_records - before.journal_records) / fsyncs))
    # The disk is shared with whatever else runs: measure the raw loop and the ceiling right after the node and
    # once more after a second node run, and compare sums, so drift hits all three alike.
    raw_entries, raw_elapsed = _raw_fsync_loop(work / "raw-fsync.dat", size, group, args.seconds)
    ceiling_runs = [measure([ceiling], 1, size, batch, window, args.warmup, args.seconds)]
    more, more_elapsed, more_cpu = asyncio.run(
        _drive(node.address, ledger_ids[1], size, batch, window, args.warmup, args.seconds, clock)
    )
    acked, elapsed = acked + more, elapsed + more_elapsed
    node_cpu, driver_cpu = (a + b for a, b in zip(cpu, more_cpu))
    raw_more, raw_more_elapsed = _raw_fsync_loop(work / "raw-fsync.dat", size, group, args.seconds)
    raw_entries, raw_elapsed = raw_entries + raw_more, raw_elapsed + raw_more_elapsed
    ceiling_runs.append(measure([ceiling], 1, size, batch, window, args.warmup, args.seconds))
    node_rate, raw_rate = acked / elapsed, raw_entries / raw_elapsed
    node_mb, raw_mb = node_rate * size / 1e6, raw_rate * size / 1e6
    ceiling_rate = sum(run.entries_per_s for run in ceiling_runs) / len(ceiling_runs)
    ceiling_cores = sum(run.server_cores for run in ceiling_runs) / len(ceiling_runs)
    ceiling_driver = sum(run.driver_cores for run in ceiling_runs) / len(ceiling_runs)
    print(f"node {label}: {node_rate:,.0f} entries/s {node_mb:,.1f} MB/s "
          f"(raw fsync file, groups of {group}: {raw_rate:,.0f}/s {raw_mb:,.1f} MB/s) "
          f"ratio {node_rate / raw_rate:.2f}; {group} adds per fsync", flush=True)
    print(f"  ceiling (a Python gRPC server that only writes, fdatasyncs and answers; node_ceiling.py): "
          f"{ceiling_rate:,.0f} entries/s {ceiling_rate * size / 1e6:,.1f} MB/s, ratio {ceiling_rate / raw_rate:.2f} "
          f"to the raw file, server {ceiling_cores:.2f} + driver {ceiling_driver:.2f} cores; the node reaches "
          f"{node_rate / max(ceiling_rate, 1e-9):.2f} of it", flush=True)
    per_entry = node_cpu / max(acked, 1)
    print(f"  cpu per acknowledged entry: node {per_entry * 1e6:,.2f} us ({node_cpu / elapsed:.2f} cores), "
          f"driver {driver_cpu / max(acked, 1) * 1e6:,.2f} us ({driver_cpu / elapsed:.2f} cores) of "
          f"{os.cpu_count()}; the node at one full core: {1 / max(per_entry, 1e-9):,.0f} entries/s", flush=True)
    if size < MiB:
        outcome = verdict(node_rate, TARGET_SMALL_ENTRIES_PER_S, ceiling_rate, f"reaches {ceiling_rate:,.0f}/s")
        print(f"  target {label} >= {TARGET_SMALL_ENTRIES_PER_S:,} acknowledged entries/s: {outcome}", flush=True)
    else:
        outcome = verdict(node_rate / raw_rate, TARGET_LARGE_RATIO, ceiling_rate / raw_rate,
                          f"reaches {ceiling_rate / raw_rate:.2f}")
        print(f"  target {label} >= {TARGET_LARGE_RATIO:.0%} of raw fsynced-file MB/s: MB/s ratio "
              f"{node_mb / raw_mb:.2f}, {outcome}", flush=True)


async def _drive(address: str, ledger_id: int, size: int, batch: int, window: int, warmup: float,
                 seconds: float, clock: CpuClock) -> tuple[int, float, tuple[float, float]]:
    """Keep `window` entries in flight on one Add stream, asking for answers in ranges (ledger.proto
    AddRange); (entries acknowledged OK, seconds, (node, driver) CPU seconds) after warmup."""
    key = master_key(_PASSWORD)
    payload = os.urandom(size)
    async with grpc.aio.insecure_channel(address, options=[
        ("grpc.max_receive_message_length", _MAX_MESSAGE), ("grpc.max_send_message_length", _MAX_MESSAGE),
    ]) as channel:
        call = channel.stream_stream("/ledger.v1.StorageNode/Add", request_serializer=lambda b: b,
                                     response_deserializer=pb.AddResponse.FromString)()
        state = {"in_flight": 0, "acked": 0, "failed": None, "measuring": False, "counted": 0}
        credit = asyncio.Event()
        loop = asyncio.get_running_loop()
        end = loop.time() + warmup + seconds

        async def receive() -> None:
            async for response in call:
                answered = 0
                answers = [(r.first_entry_id, r.last_entry_id, r.status, r.message) for r in response.ranges]
                answers += [(r.entry_id, r.entry_id, r.status, r.message) for r in response.results]
                for first, last, status, message in answers:
                    if status != pb.OK:
                        state["failed"] = f"entry {first}: {pb.Status.Name(status)} {message}"
                    elif state["measuring"]:
                        state["counted"] += last - first + 1
                    answered += last - first + 1
                state["in_flight"] -= answered
                credit.set()

        receiver = asyncio.ensure_future(receive())
        entry_id = 0
        started = cpu_from = None
        while loop.time() < end and state["failed"] is None:
            if started is None and loop.time() >= end - seconds:
                state["measuring"], started, cpu_from = True, time.perf_counter(), clock.read()
            if state["in_flight"] + batch > window:
                credit.clear()
                await credit.wait()
                continue
            request = _encode_add_request(ledger_id, range(entry_id, entry_id + batch), key, payload)
            entry_id += batch
            state["in_flight"] += batch
            await call.write(request)
        state["measuring"] = False
        elapsed = time.perf_counter() - (started or time.perf_counter())
        cpu_to = clock.read()
        cpu = tuple(to - fro for to, fro in zip(cpu_to, cpu_from or cpu_to))
        await call.done_writing()
        await receiver
    if state["failed"]:
        raise SystemExit(f"bench: the node refused an add: {state['failed']}")
    return state["counted"], max(elapsed, 1e-9), cpu


def _encode_add_request(ledger_id: int, entry_ids: range, key: bytes, payload: bytes) -> bytes:
    """AddRequest wire bytes with the payload copied once per entry, so the Python client is not what limits
    the node; answers asked for in ranges."""
    adds = [wire.AddFields(e, e - 1, entry_digest(ledger_id, e, e - 1, payload), payload) for e in entry_ids]
    return b"".join([*wire.add_requests(ledger_id, key, 0, adds), wire.RANGE_RESULTS])


def _raw_fsync_loop(path: pathlib.Path, size: int, group: int, seconds: float) -> tuple[int, float]:
    """The machine's limit: append `group` entries of `size` bytes with one write, then fdatasync, dropping
    synced pages from the page cache as the journal does; repeat."""
    buffer = os.urandom(size) * group
    synced = SyncedFile(path, _PAGE_CACHE_BYTES)
    entries = 0
    try:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            synced.write_group([buffer])
            entries += group
        elapsed = time.perf_counter() - start
    finally:
        synced.remove()
    return entries, elapsed


class _NodeUnderTest:
    def __init__(self, data_dir: pathlib.Path, metadata_uri: str):
        self.node = start_node(
            node_command(data_dir, 0, metadata_uri, NODE_ID, "--checkpoint-interval", "3600",
                         "--journal-page-cache-bytes", str(_PAGE_CACHE_BYTES)),
            NODE_ID, NODE_START_SECONDS,
        )
        self.address = self.node.address
        self.pid = self.node.pid
        self.channel = grpc.insecure_channel(self.address)
        self.stub = ledger_pb2_grpc.StorageNodeStub(self.channel)

    def info(self) -> pb.NodeInfoResponse:
        return self.stub.NodeInfo(pb.NodeInfoRequest(), timeout=30)

    def stop(self) -> None:
        self.channel.close()
        self.node.stop(30)
