"""A reader whose calls are cut off when the transport drops a node (issue 15: the soak's tailing readers
crashed 0.2-10 s after a node kill).

When one call to a node fails UNAVAILABLE, GrpcTransport forgets the node and closes its channel; grpc then
cancels every other call still in flight on that channel. Those calls must end as NodeError, so that the
long poll and the range reads fail over to the other nodes, and must not leak asyncio's CancelledError (which
ReadHandle.read turned into concurrent.futures.CancelledError, outside the LedgerError hierarchy). A
cancellation the caller asked for is still a cancellation.

The tests reproduce the interleaving deterministically: real nodes, the real transport, calls held in flight
(a long poll on a ledger whose LAC does not move; range reads to a node paused with SIGSTOP), then the
transport's own forget path, the one an UNAVAILABLE reply takes. The transport is observed (a subclass that
counts the calls in flight per node and method), never replaced.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib

import pytest

from connector.client import LedgerClient
from protos import ledger_pb2 as pb
from tests.harness.observed_transport import ObservedClient, ObservedTransport, observed
from tests.harness.poll import poll_until

ENTRIES = 300
READER_TIMEOUT = 60.0  # a cut-off call must fail over at once, long before a per-answer deadline ends it
OUTCOME_TIMEOUT = 45.0
POLL_SECONDS = 40.0  # the long poll's own wait for a new LAC (a failing test waits for it at most this long)


def _drop_node(client: LedgerClient, node: str) -> None:
    """What GrpcTransport does when a call to node fails UNAVAILABLE: forget it and close its channel."""
    asyncio.run_coroutine_threadsafe(_on_loop(observed(client)._forget, node), client._runtime.loop).result(10)


async def _on_loop(fn, *args):
    fn(*args)


@contextlib.contextmanager
def _threads():
    """Threads for the blocking API calls; a failing test does not wait for a poll still running."""
    pool = concurrent.futures.ThreadPoolExecutor(2)
    try:
        yield pool
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _assert_waiting(poll: concurrent.futures.Future) -> None:
    """The long poll goes on with the other nodes: the LAC has not moved yet."""
    if poll.done():
        pytest.fail(f"the long poll returned {poll.result(0)} before the LAC moved")  # or raises what ended it


def _written_ledger(writer: LedgerClient) -> tuple:
    """An OPEN ledger E3 WQ3 AQ2 with ENTRIES entries whose LAC every node holds (the writer idles)."""
    handle = writer.create_ledger(3, 3, 2)
    futures = [handle.append_async(b"entry-%d" % i) for i in range(ENTRIES)]
    assert [f.result(60) for f in futures] == list(range(ENTRIES))
    return handle, {i: b"entry-%d" % i for i in range(ENTRIES)}


def _tailing_reader(reader: LedgerClient, ledger_id: int):
    handle = reader.open_ledger(ledger_id, recover=False)
    poll_until(lambda: handle.read_lac() == ENTRIES - 1, 30, what="every node to hold the writer's LAC")
    return handle


def test_a_long_poll_cut_off_by_the_transport_dropping_its_node_fails_over_to_the_other_nodes(cluster, metadata_uri):
    """Fails before d22806c: ReadHandle.wait_lac raised concurrent.futures.CancelledError."""
    cluster(3)
    with LedgerClient(metadata_uri, add_timeout=300) as writer, \
            ObservedClient(metadata_uri, timeout=READER_TIMEOUT) as reader:
        handle, _ = _written_ledger(writer)
        tail = _tailing_reader(reader, handle.ledger_id)
        dropped = handle.metadata.last_fragment.ensemble[0]
        ensemble = handle.metadata.last_fragment.ensemble
        transport = observed(reader)
        with _threads() as pool:
            poll = pool.submit(tail.wait_lac, ENTRIES - 1, POLL_SECONDS)
            poll_until(lambda: all(transport.in_flight[n, "WaitLac"] for n in ensemble), 30,
                       what="the long poll in flight on every node of the ensemble")
            _drop_node(reader, dropped)
            poll_until(lambda: not transport.in_flight[dropped, "WaitLac"], 30,
                       what=f"the long poll to {dropped} to end with its channel")
            _assert_waiting(poll)
            assert handle.append(b"next") == ENTRIES
            assert poll.result(OUTCOME_TIMEOUT) == ENTRIES


def test_range_reads_and_a_long_poll_cut_off_by_the_transport_dropping_their_node_fail_over(cluster, metadata_uri):
    """The soak's tailing reader: a long poll and range reads in flight to one node when the transport drops it.
    Fails before the streaming fix: ReadHandle.read raised concurrent.futures.CancelledError (and before
    d22806c the long poll did too)."""
    nodes = {n.node_id: n for n in cluster(3)}
    # no speculative read: the range read waits on the paused node until the transport drops it
    with LedgerClient(metadata_uri, add_timeout=300) as writer, \
            ObservedClient(metadata_uri, timeout=READER_TIMEOUT, speculative_read_timeout=0) as reader:
        handle, written = _written_ledger(writer)
        tail = _tailing_reader(reader, handle.ledger_id)
        ensemble = handle.metadata.last_fragment.ensemble
        dropped = ensemble[0]  # the node the first chunk's range read goes to (E = WQ, a read from entry 0)
        transport = observed(reader)
        nodes[dropped].pause()
        try:
            with _threads() as pool:
                poll = pool.submit(tail.wait_lac, ENTRIES - 1, POLL_SECONDS)
                read = pool.submit(lambda: {e.entry_id: e.payload for e in tail.read(0, ENTRIES - 1)})
                poll_until(lambda: all(transport.in_flight[dropped, m] for m in ("ReadRange", "WaitLac")), 30,
                           what=f"a range read and a long poll in flight to the paused node {dropped}")
                _drop_node(reader, dropped)
                assert read.result(OUTCOME_TIMEOUT) == written  # from the other two replicas
                _assert_waiting(poll)
                assert handle.append(b"next") == ENTRIES
                assert poll.result(OUTCOME_TIMEOUT) == ENTRIES
        finally:
            nodes[dropped].resume()


@pytest.mark.parametrize("call", ["ReadRange", "WaitLac"])
def test_a_caller_cancelling_its_call_still_gets_a_cancellation(cluster, metadata_uri, call):
    """The caller's own cancellation (a read given up, a client closing) is not turned into a node failure."""
    nodes = {n.node_id: n for n in cluster(3)}
    with LedgerClient(metadata_uri, add_timeout=300) as writer, \
            ObservedClient(metadata_uri, timeout=READER_TIMEOUT) as reader:
        handle, _ = _written_ledger(writer)
        _tailing_reader(reader, handle.ledger_id)
        node = handle.metadata.last_fragment.ensemble[0]
        transport = observed(reader)
        nodes[node].pause()  # the call stays in flight until it is cancelled
        try:
            outcome = asyncio.run_coroutine_threadsafe(
                _cancel_in_flight(transport, node, call, handle.ledger_id), reader._runtime.loop).result(60)
        finally:
            nodes[node].resume()
        assert outcome == "cancelled"


async def _cancel_in_flight(transport: ObservedTransport, node: str, call: str, ledger_id: int) -> str:
    """Start one call to node, cancel its task once it is in flight; how the task ended."""
    async def range_read() -> None:
        request = pb.ReadRangeRequest(ledger_id=ledger_id, first_entry_id=0, last_entry_id=ENTRIES - 1)
        async for _ in transport.read_range(node, request, READER_TIMEOUT):
            pass

    async def long_poll() -> None:
        request = pb.WaitLacRequest(ledger_id=ledger_id, previous_lac=ENTRIES - 1, timeout_ms=60_000)
        await transport.wait_lac(node, request, READER_TIMEOUT)

    task = asyncio.ensure_future(range_read() if call == "ReadRange" else long_poll())
    for _ in range(600):
        if transport.in_flight[node, call] or task.done():
            break
        await asyncio.sleep(0.05)
    assert transport.in_flight[node, call], f"the {call} call never got in flight"
    task.cancel()
    await asyncio.wait([task], timeout=30)
    if task.cancelled():
        return "cancelled"
    return f"ended with {task.exception()!r}" if task.done() else "still running"
