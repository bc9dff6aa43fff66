"""The node ceiling: the least a Python gRPC storage node does with an entry, as a yardstick for `ledger bench node`
and `ledger bench client` (as connector/bench/ceiling.py is for the Spark paths).

A server process (`python -m connector.bench.node_ceiling DIR`) takes one bidirectional stream of messages of
raw bytes (grpc.aio, no protobuf), and does with them what a storage node cannot do without: appends what has
arrived to one file with one write, fdatasync, drops the synced pages from the page cache as the node's journal
does, on a thread beside the event loop, and answers each such group with one message (the count of messages it
made durable). It keeps large buffers on the heap as the node does (protos/heap.py). No parsing, digest, frame
checksum, index or ledger state. What it reaches on a machine is the
most any storage node written on Python's gRPC reaches there; where that misses a target, the target is bound
on that machine, not by the node's own work.

`measure` is the writer's side: one stream per server, every message to every server, `window` messages in
flight, a message acknowledged once `ack_quorum` servers have made it durable (as the replicated writer's
E=WQ=n, AQ).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import os
import pathlib
import select
import subprocess
import sys
import time

import grpc

from connector.bench.cpu import CpuClock
from protos.heap import keep_large_buffers_on_heap

METHOD = "/ledger.bench.NodeCeiling/Append"
_MAX_MESSAGE = 256 * 1024 * 1024
DROP_STEP = 4 * 1024 * 1024           # the journal's step for dropping pages (storage_node/journal.py)
_PAGE = os.sysconf("SC_PAGE_SIZE")
_IOV_MAX = os.sysconf("SC_IOV_MAX")
START_SECONDS = 60.0
DRAIN_SECONDS = 60.0


class SyncedFile:
    """A file written as the node's journal writes: each group of buffers appended with one write, then fdatasync,
    then the synced pages beyond the page cache allowance (--journal-page-cache-bytes) dropped, whole pages in
    steps of DROP_STEP (storage_node/journal.py). The raw file of `ledger bench node` and the ceiling's."""

    def __init__(self, path: pathlib.Path, page_cache_bytes: int = 0):
        self.path = path
        self.page_cache_bytes = page_cache_bytes
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self.written = self.dropped = 0

    def write_group(self, buffers: list) -> None:
        for start in range(0, len(buffers), _IOV_MAX):
            chunk = buffers[start:start + _IOV_MAX]
            size = sum(map(len, chunk))
            if os.writev(self.fd, chunk) != size:
                raise OSError(f"short write to {self.path} (is its disk full?)")
            self.written += size
        os.fdatasync(self.fd)
        cold = (self.written - self.page_cache_bytes) // _PAGE * _PAGE
        if cold - self.dropped >= DROP_STEP:
            os.posix_fadvise(self.fd, self.dropped, cold - self.dropped, os.POSIX_FADV_DONTNEED)
            self.dropped = cold

    def remove(self) -> None:
        os.close(self.fd)
        self.path.unlink()


async def _serve(directory: pathlib.Path) -> None:
    loop = asyncio.get_running_loop()
    streams = itertools.count()

    async def append(request_iterator, context):
        """One file per stream, removed when the stream ends (as the raw file is after each run)."""
        journal = SyncedFile(directory / f"stream-{next(streams)}.dat")
        pending: list[bytes] = []
        arrived = asyncio.Event()

        async def read() -> None:
            async for message in request_iterator:
                pending.append(message)
                arrived.set()

        reader = asyncio.ensure_future(read())
        reader.add_done_callback(lambda _: arrived.set())    # its end, or its failure, wakes the loop below
        writing = None
        try:
            while pending or not reader.done():
                if not pending:
                    arrived.clear()
                    await arrived.wait()
                    continue
                group = pending[:]
                pending.clear()
                writing = loop.run_in_executor(None, journal.write_group, group)
                await writing
                await context.write(len(group).to_bytes(4, "little"))
            reader.result()      # a stream that failed ends the call with that failure
        finally:
            reader.cancel()
            if writing is not None:     # cancelled mid-write: the file stays open until its thread is done with it
                with contextlib.suppress(Exception):
                    await asyncio.shield(writing)
            journal.remove()

    server = grpc.aio.server(options=[("grpc.max_receive_message_length", _MAX_MESSAGE)])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("ledger.bench.NodeCeiling", {
        "Append": grpc.stream_stream_rpc_method_handler(append),
    })])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())    # nothing else goes to the pipe nobody reads after this
    await loop.run_in_executor(None, sys.stdin.read)     # until the driver closes our stdin (or exits)
    await server.stop(None)


class CeilingServer:
    """A server process in `directory`; stop() ends it. Its first line on stdout is its port, once it listens."""

    def __init__(self, directory: pathlib.Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen([sys.executable, "-m", "connector.bench.node_ceiling", str(directory)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.process.pid
        ready, _, _ = select.select([self.process.stdout], [], [], START_SECONDS)   # nothing: it died, or hangs
        line = self.process.stdout.readline() if ready else ""
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"the node ceiling's server in {directory} did not start within {START_SECONDS:.0f} s "
                               f"(exit status {self.process.poll()}; its errors are above)")
        self.address = f"127.0.0.1:{int(line)}"

    def stop(self) -> None:
        self.process.stdin.close()
        self.process.stdout.close()
        try:
            self.process.wait(START_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclasses.dataclass(frozen=True)
class CeilingRun:
    entries_per_s: float
    server_cores: float       # all the servers' CPU over the measured seconds, in cores
    driver_cores: float


def measure(servers: list[CeilingServer], ack_quorum: int, size: int, batch: int, window: int, warmup: float,
            seconds: float) -> CeilingRun:
    """Entries of `size` bytes, `batch` to a message, to every one of `servers`, about `window` entries in flight,
    each acknowledged once ack_quorum servers have made it durable."""
    if not 1 <= ack_quorum <= len(servers):
        raise ValueError(f"ack quorum {ack_quorum} must be between 1 and the number of servers, {len(servers)}")
    clock = CpuClock([server.pid for server in servers])
    messages, elapsed, (servers_cpu, driver_cpu) = asyncio.run(_drive(
        [server.address for server in servers], size * batch, max(1, window // batch), ack_quorum, warmup, seconds,
        clock))
    return CeilingRun(messages * batch / elapsed, servers_cpu / elapsed, driver_cpu / elapsed)


def verdict(value: float, target: float, ceiling: float | None = None, ceiling_text: str = "") -> str:
    """A benchmark's verdict on a target (reached when value >= target): met, missed, or missed where the ceiling
    measured in the same run (its value on the same scale) misses it too: bound on this machine, in this run."""
    if value >= target:
        return "met"
    if ceiling is not None and ceiling < target:
        return f"MISSED, bound on this machine: the ceiling {ceiling_text}"
    return "MISSED"


async def _drive(addresses: list[str], size: int, window: int, ack_quorum: int, warmup: float, seconds: float,
                 clock: CpuClock) -> tuple[int, float, tuple[float, float]]:
    """Send `size`-byte messages to every server, `window` in flight; (messages acknowledged by ack_quorum
    servers in the measured seconds, those seconds, the clock's CPU seconds over them). Each server has a sender
    of its own, as the writer has for each node (connector/client/transport.py): a slow one holds up no other."""
    payload = os.urandom(size)
    loop = asyncio.get_running_loop()
    channels = [grpc.aio.insecure_channel(a, options=[("grpc.max_send_message_length", _MAX_MESSAGE)])
                for a in addresses]
    calls = [c.stream_stream(METHOD)() for c in channels]
    queues = [0] * len(calls)          # messages queued for each server's sender
    wakeups = [asyncio.Event() for _ in calls]
    durable = [0] * len(calls)         # messages each server has made durable (it answers in order)
    acked = 0                          # messages ack_quorum servers have made durable
    sending = True
    credit = asyncio.Event()

    async def send(index: int, call) -> None:
        while sending or queues[index]:
            if not queues[index]:
                wakeups[index].clear()
                await wakeups[index].wait()
                continue
            queues[index] -= 1
            await call.write(payload)
        await call.done_writing()

    async def receive(index: int, call) -> None:
        nonlocal acked
        try:
            while (answer := await call.read()) is not grpc.aio.EOF:
                durable[index] += int.from_bytes(answer, "little")
                acked = sorted(durable, reverse=True)[ack_quorum - 1]
                credit.set()
        finally:
            credit.set()               # the loop below sees a stream that ended

    tasks = [asyncio.ensure_future(coroutine(i, c)) for i, c in enumerate(calls) for coroutine in (send, receive)]
    sent = 0
    try:
        end = loop.time() + warmup + seconds
        started = counted_from = cpu_from = None
        while loop.time() < end:
            ended = [task for task in tasks if task.done()]
            if ended:
                ended[0].result()      # raises what ended it
                raise SystemExit(f"bench: a node ceiling server ended its stream after {sent} messages")
            if started is None and loop.time() >= end - seconds:
                started, counted_from, cpu_from = time.perf_counter(), acked, clock.read()
            if sent - acked >= window:
                credit.clear()
                with contextlib.suppress(asyncio.TimeoutError):     # no answer at all: stop at the end
                    await asyncio.wait_for(credit.wait(), max(0.0, end - loop.time()))
                continue
            for index in range(len(calls)):
                queues[index] += 1
                wakeups[index].set()
            sent += 1
        elapsed = time.perf_counter() - (started or time.perf_counter())
        counted = acked - (acked if counted_from is None else counted_from)
        cpu_to = clock.read()
        cpu = tuple(to - fro for to, fro in zip(cpu_to, cpu_from or cpu_to))
        sending = False
        for wakeup in wakeups:
            wakeup.set()
        try:
            await asyncio.wait_for(asyncio.gather(*tasks), DRAIN_SECONDS)
        except asyncio.TimeoutError:
            raise SystemExit(f"bench: a node ceiling server did not take or answer the last messages within "
                             f"{DRAIN_SECONDS:.0f} s") from None
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
        details = f"{exc.code().name} {exc.details()}" if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
        raise SystemExit(f"bench: a node ceiling server failed: {details} (its errors are above)") from None
    finally:
        for task in tasks:
            task.cancel()
        for channel in channels:
            await channel.close()
    return counted, max(elapsed, 1e-9), cpu


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m connector.bench.node_ceiling",
                                     description="the node ceiling's server (connector/bench/node_ceiling.py); "
                                                 "prints its port, serves until its stdin ends")
    parser.add_argument("directory", type=pathlib.Path, help="where it writes each stream's file")
    args = parser.parse_args()
    keep_large_buffers_on_heap()     # as the storage node does at start-up
    asyncio.run(_serve(args.directory))


if __name__ == "__main__":
    main()
