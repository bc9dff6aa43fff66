"""Reads: one ReadRange call (the one loop that serves recovery, chunk reads and re-replication), chunk and
entry reads with failover, raced by one speculative loop (_race), and the LAC reads (rule 10's fencing read, and
the long poll of tailing readers)."""
from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Awaitable, Callable, TypeVar

from connector.client import metrics
from connector.client.errors import NodeError, answered, status_name
from connector.client.ops.read import (
    ChunkRead, Entry, EntryCall, EntryRead, RangeCall, Speculation,
)
from connector.client.ops.read_lac import ReadLacOp, WaitLacOp
from connector.client.runner.context import Context, cancel_and_wait, schedule_of, until_done
from metadata.model import LedgerMetadata
from protos import ledger_pb2 as pb
from protos.limits import MAX_WAIT_LAC_MS

ENDED_EARLY = "the node ended the range without its done marker"
WAIT_LAC_GRACE_SECONDS = 0.5   # a long poll's round waits this much longer than the nodes, for their answers
Call = TypeVar("Call", RangeCall, EntryCall)


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
    """The chunk's entries: its range calls, raced (_race: other replicas are asked as well for a call that keeps
    the chunk waiting), then single-entry reads for what no call delivered. Nodes that failed the client recently
    (ctx.read_failures) are asked last; nodes that fail or keep a call waiting are added to them."""

    async def range_call(call: RangeCall, on_progress: Callable[[], None]) -> list[RangeCall]:
        end = await read_range(ctx, chunk.ledger_id, call, chunk.on_entry, on_message=on_progress)
        if not answered(end.status):
            _note_failure(ctx, call.node)
        chunk.on_call_done(call, end.reason)
        return []   # what the call did not deliver is read entry by entry once every call has ended

    await _race(ctx, chunk.start(_try_last(ctx)), range_call, lambda slow: chunk.speculate(slow, _try_last(ctx)),
                lambda: chunk.complete)
    if not chunk.complete:
        reads = chunk.failovers(_try_last(ctx))
        await asyncio.gather(*(read_entry(ctx, read) for read in reads))
        for read in reads:
            if read.entry is None:
                raise read.error()
            chunk.on_failover_done(read)
    entries = chunk.in_order()
    metrics.entries_read(entries)
    return entries


async def read_entry(ctx: Context, read: EntryRead) -> None:
    """One entry from the replicas of its write set, one after another, raced (_race: the next is asked as well
    when one keeps the read waiting). read.entry stays None if no replica delivered it (read.error() says why)."""
    request = pb.ReadRequest(ledger_id=read.ledger_id, entry_id=read.entry_id)

    async def entry_call(call: EntryCall, on_progress: Callable[[], None]) -> list[EntryCall]:
        try:
            response = await ctx.transport.read(call.node, request, ctx.timeout)
        except NodeError as exc:
            read.on_failure(call.node, str(exc))
            _note_failure(ctx, call.node)
        else:
            read.on_response(call.node, response)
            if not answered(response.status):
                _note_failure(ctx, call.node)
        return read.calls()   # the next replica after a failure; none once the entry is in

    await _race(ctx, read.calls(), entry_call, read.speculate, lambda: read.complete)


async def _race(ctx: Context, calls: list[Call], run: Callable[[Call, Callable[[], None]], Awaitable[list[Call]]],
                speculate: Callable[[str], list[Call]], complete: Callable[[], bool]) -> None:
    """A read's calls, raced until complete(), the one speculative read for chunks and entries alike (when:
    ops.read.Speculation; whom and what counts: the read's speculate and complete). run(call, on_progress) makes
    a call, calling on_progress at each answer that comes, and returns the calls to make next (a failover's). A
    call overdue has its node noted as slow and speculate(node) made as well. Once complete() (or once every call
    has ended) the calls still running are cancelled and waited for."""
    loop = asyncio.get_running_loop()
    speculation = Speculation(ctx.speculative_timeout)
    tasks: dict[asyncio.Future, Call] = {}

    def progress_of(call: Call) -> Callable[[], None]:
        return lambda: speculation.on_progress(call, loop.time())

    def start(new_calls: list[Call]) -> None:
        for call in new_calls:
            speculation.on_start(call, loop.time())
            tasks[asyncio.ensure_future(run(call, progress_of(call)))] = call

    try:
        start(calls)
        while tasks and not complete():
            due = speculation.due
            done, _ = await asyncio.wait(tasks, timeout=None if due is None else max(0.0, due - loop.time()),
                                         return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                speculation.on_end(tasks.pop(task))
                start(task.result())   # a bug's exception, raised here (a node's failure is the call's outcome)
            if complete():
                break
            for call in speculation.overdue(loop.time()):
                _note_failure(ctx, call.node)
                spares = speculate(call.node)
                metrics.SPECULATIVE_READS.inc(len(spares))
                start(spares)
    finally:
        await cancel_and_wait(tasks)


def _try_last(ctx: Context) -> frozenset[str]:
    """The nodes that failed this client's reads recently (a reader has no registry at hand: only time clears them)."""
    return ctx.read_failures.held({}, asyncio.get_running_loop().time())


def _note_failure(ctx: Context, node: str) -> None:
    ctx.read_failures.add((node,), {}, asyncio.get_running_loop().time())


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
    """Long poll (a tailing reader's): the LAC once a node of the last fragment knows one past previous (it answers
    at once), else previous at timeout. A node waits at most MAX_WAIT_LAC_MS per call, so a longer wait is several
    rounds. A round ends as soon as a node's LAC passes previous, or the answers reach quorum coverage (each
    waited its time and saw nothing newer), or at its wait plus WAIT_LAC_GRACE_SECONDS: a paused node does not
    hold it; the calls still waiting are cancelled. An error status is that node's failure, not "no news": when
    every node failed, the wait raises the op's NodeError."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        wait = min(max(0.0, deadline - loop.time()), MAX_WAIT_LAC_MS / 1000)
        started = loop.time()
        lac = await _wait_round(ctx, meta, previous, wait)
        # No news: another round while the caller's time lasts, unless this one ended well before its time (nodes
        # that answer at once without news would otherwise make this loop spin).
        if lac > previous or loop.time() >= deadline or loop.time() - started < wait / 2:
            return lac


async def _wait_round(ctx: Context, meta: LedgerMetadata, previous: int, wait: float) -> int:
    """One WaitLac call to each node of the last fragment, each waiting at most wait seconds."""
    op = WaitLacOp(meta.ledger_id, schedule_of(meta), meta.last_fragment.ensemble, previous)
    request = pb.WaitLacRequest(ledger_id=meta.ledger_id, previous_lac=previous, timeout_ms=math.ceil(wait * 1000))

    async def ask(node: str) -> None:
        try:
            response = await ctx.transport.wait_lac(node, request, wait + ctx.timeout)
            op.on_response(node, response.status, response.last_entry_id, response.last_add_confirmed,
                           response.message)
        except NodeError as exc:
            op.on_failure(node, str(exc))

    await until_done(op, [ask(node) for node in op.requests()], within=wait + WAIT_LAC_GRACE_SECONDS)
    return op.outcome()
