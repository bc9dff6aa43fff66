"""Reads: one ReadRange call (the one loop that serves recovery, chunk reads and re-replication), chunk
reads with failover, and the LAC reads (rule 10's fencing read, and the long poll of tailing readers)."""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Callable

from connector.client import metrics
from connector.client.errors import NodeError, status_name
from connector.client.ops.read import ChunkRead, Entry, EntryRead, RangeCall
from connector.client.ops.read_lac import ReadLacOp
from connector.client.runner.context import Context, schedule_of, until_done
from metadata.model import LedgerMetadata
from protos import ledger_pb2 as pb

ENDED_EARLY = "the node ended the range without its done marker"


@dataclasses.dataclass(frozen=True)
class RangeEnd:
    """How one ReadRange call ended. Only a complete call (the node said done, status OK) says anything
    about the entries it did not return (rule 11); otherwise status is the node's, or STATUS_UNKNOWN for a
    broken call or a stream that ended without its done marker, and reason says why."""

    status: int = pb.OK
    reason: str = ""

    @property
    def complete(self) -> bool:
        return self.status == pb.OK


async def read_range(ctx: Context, ledger_id: int, call: RangeCall, on_entry: Callable[[str, pb.ReadResponse], None],
                     *, fence: bool = False, master_key: bytes = b"",
                     on_message: Callable[[], None] | None = None) -> RangeEnd:
    """Stream the entries of call into on_entry(node, entry); on_message runs after each message."""
    request = pb.ReadRangeRequest(ledger_id=ledger_id, first_entry_id=call.first_entry_id,
                                  last_entry_id=call.last_entry_id, fence=fence, master_key=master_key)
    end, done = RangeEnd(), False
    try:
        async for response in ctx.transport.read_range(call.node, request, ctx.timeout):
            if response.status != pb.OK and end.complete:
                end = RangeEnd(response.status, f"{status_name(response.status)} {response.message}".strip())
            for entry in response.entries:
                on_entry(call.node, entry)
            done = done or response.done
            if on_message is not None:
                on_message()
    except NodeError as exc:
        return RangeEnd(pb.STATUS_UNKNOWN, str(exc))
    if not done:
        return RangeEnd(pb.STATUS_UNKNOWN, f"{ENDED_EARLY} ({end.reason})" if end.reason else ENDED_EARLY)
    return end


async def read_chunk(ctx: Context, chunk: ChunkRead) -> list[Entry]:
    async def range_call(call: RangeCall) -> None:
        end = await read_range(ctx, chunk.ledger_id, call, chunk.on_entry)
        chunk.on_call_done(call, end.reason)

    async def failover(read: EntryRead) -> None:
        request = pb.ReadRequest(ledger_id=chunk.ledger_id, entry_id=read.entry_id)
        while (node := read.next_node()) is not None:
            try:
                read.on_response(node, await ctx.transport.read(node, request, ctx.timeout))
            except NodeError as exc:
                read.on_failure(node, str(exc))
        if read.entry is None:
            raise read.error()
        chunk.on_failover_done(read)

    await asyncio.gather(*(range_call(call) for call in chunk.calls))
    await asyncio.gather(*(failover(read) for read in chunk.failovers()))
    entries = chunk.in_order()
    metrics.entries_read(entries)
    return entries


async def read_last_add_confirmed(ctx: Context, meta: LedgerMetadata, master_key: bytes, fence: bool) -> ReadLacOp:
    """Rule 10: the LAC from quorum coverage of the last fragment; with fence=True this fences the ledger."""
    op = ReadLacOp(meta.ledger_id, schedule_of(meta), meta.last_fragment.ensemble, fence)
    request = pb.ReadLacRequest(ledger_id=meta.ledger_id, fence=fence, master_key=master_key)

    async def ask(node: str) -> None:
        try:
            response = await ctx.transport.read_lac(node, request, ctx.timeout)
            op.on_response(node, response.status, response.last_entry_id, response.last_add_confirmed,
                           response.message)
        except NodeError as exc:
            op.on_failure(node, str(exc))

    await until_done(op, [ask(node) for node in op.requests()])
    op.outcome()
    return op


async def wait_last_add_confirmed(ctx: Context, meta: LedgerMetadata, previous: int, timeout: float) -> int:
    """Long poll: the first node of the last fragment whose LAC passes previous answers; else the highest seen."""
    request = pb.WaitLacRequest(ledger_id=meta.ledger_id, previous_lac=previous, timeout_ms=int(timeout * 1000))
    best = previous
    calls = [asyncio.ensure_future(ctx.transport.wait_lac(node, request, timeout + ctx.timeout))
             for node in meta.last_fragment.ensemble]
    try:
        for next_done in asyncio.as_completed(calls):
            try:
                response = await next_done
            except NodeError:
                continue
            if response.status == pb.OK:
                best = max(best, response.last_add_confirmed)
            if best > previous:
                break
    finally:
        for call in calls:
            call.cancel()
    return best
