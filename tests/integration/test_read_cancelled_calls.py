"""Read calls a read gives up on end when it does (review 2026-11-29: a speculative read cancelled its losing calls
without waiting for them, and a cancelled ReadRange could go on streaming).

A read cancels the calls it no longer needs: a speculative read's losers, the other replicas of an entry once one
answered. A cancelled call must stop there, not hold its gRPC stream and the messages it receives until its
node's deadline. Real nodes and the real transport: the moment a message arrives is caught where the transport
decodes it (protos.wire.read_range_message), and a paused node (SIGSTOP) makes a speculative read's loser.
"""
from __future__ import annotations

import asyncio

from connector.client import LedgerClient
from connector.client.ops.read import ChunkPlan, EntryRead
from connector.client.runner.read import read_chunk, read_entry, read_last_add_confirmed
from protos import ledger_pb2 as pb
from protos import wire
from tests.harness.observed_transport import ObservedClient, observed

ENTRIES = 40
CANCEL_AT = 2   # the message whose arrival the reader is cancelled at
READER_TIMEOUT = 60.0   # a losing call left to run would hold on for this long
DEADLINE = 20.0


def _closed_ledger(uri: str, ensemble: int) -> tuple[int, tuple[str, ...]]:
    with LedgerClient(uri) as writer:
        handle = writer.create_ledger(ensemble, ensemble, min(2, ensemble))
        handle.append_many([b"entry-%d" % i for i in range(ENTRIES)])
        meta = handle.close()
    return meta.ledger_id, meta.last_fragment.ensemble


def test_a_range_read_cancelled_as_a_message_arrives_takes_no_more(cluster, metadata_uri, monkeypatch):
    """Fails before the transport waited with asyncio.timeout: Python 3.11's wait_for handed on the message that
    arrived with the cancellation and dropped the cancellation, and the reader took all ENTRIES messages."""
    cluster(1)
    ledger_id, (node,) = _closed_ledger(metadata_uri, 1)
    request = pb.ReadRangeRequest(ledger_id=ledger_id, first_entry_id=0, last_entry_id=ENTRIES - 1,
                                  max_bytes_per_message=1)   # one entry a message
    decode = wire.read_range_message
    arrived: list[int] = []
    reader: list[asyncio.Task] = []

    def decode_and_cancel(raw: bytes):
        arrived.append(1)
        if len(arrived) == CANCEL_AT:
            reader[0].cancel()
        return decode(raw)

    monkeypatch.setattr(wire, "read_range_message", decode_and_cancel)
    with LedgerClient(metadata_uri) as client:
        async def take() -> list[int]:
            taken: list[int] = []
            async for response in client._ctx.transport.read_range(node, request, 30):
                taken += [entry.entry_id for entry in response.entries]
            return taken

        async def read() -> tuple[bool, list[int]]:
            reader.append(asyncio.ensure_future(take()))
            try:
                return False, await reader[0]
            except asyncio.CancelledError:
                return True, []

        cancelled, taken = client._runtime.run(read())
    assert cancelled, f"the cancelled reader took entries {taken} of the {ENTRIES}"
    assert len(arrived) == CANCEL_AT, f"{len(arrived) - CANCEL_AT} messages arrived after the reader was cancelled"


def test_reads_return_once_the_calls_they_cancelled_have_ended(cluster, metadata_uri):
    """Fails before the runner waited for the calls it cancelled: the paused node's ReadRange (a speculative chunk
    read's loser), Read (a speculative entry read's) and ReadLac (beyond quorum coverage) were still in flight
    when the reads returned."""
    nodes = {n.node_id: n for n in cluster(3)}
    ledger_id, ensemble = _closed_ledger(metadata_uri, 3)
    with ObservedClient(metadata_uri, timeout=READER_TIMEOUT) as reader:
        meta = reader.open_ledger(ledger_id).metadata
        chunk = ChunkPlan(meta, 0, ENTRIES - 1).next(ENTRIES)
        entry = EntryRead(ledger_id, 0, chunk.write_set(0))
        paused = ensemble[0]   # the chunk's one node (E = WQ), and the first of entry 0's write set
        assert [call.node for call in chunk.calls] == [paused] and chunk.write_set(0)[0] == paused
        in_flight = observed(reader).in_flight

        async def read() -> dict[str, object]:
            # each count is taken as the read returns, before anything else runs on the loop
            entries = await read_chunk(reader._ctx, chunk)
            left = {"ReadRange": in_flight[paused, "ReadRange"]}
            await read_entry(reader._ctx, entry)
            left["Read"] = in_flight[paused, "Read"]
            last = (await read_last_add_confirmed(reader._ctx, meta, b"", fence=False)).last_entry_id
            left["ReadLac"] = in_flight[paused, "ReadLac"]
            return {"entries": len(entries), "entry 0": entry.entry and bytes(entry.entry.payload), "last entry": last,
                    "calls left": left}

        nodes[paused].pause()
        try:
            outcome = reader._runtime.submit(read()).result(DEADLINE)
        finally:
            nodes[paused].resume()
    assert outcome == {"entries": ENTRIES, "entry 0": b"entry-0", "last entry": ENTRIES - 1,
                       "calls left": {"ReadRange": 0, "Read": 0, "ReadLac": 0}}
