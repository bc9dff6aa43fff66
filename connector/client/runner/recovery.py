"""Recovery (rules 10-12): fence the last fragment, read past the LAC, write every positive entry back,
then close in one compare-and-set that also stores the write-back's ensemble changes."""
from __future__ import annotations

import asyncio
import logging
import concurrent.futures
import functools

from connector.client import metrics
from connector.client.errors import LedgerError, RecoveryIncompleteError, RecoveryRestartError
from connector.client.ops.close import close_recovered
from connector.client.ops.read import RangeCall
from connector.client.ops.recovery import RecoveryReadOp, begin_recovery, recovery_start
from connector.client.runner.add import AddPipeline
from connector.client.runner.context import Context, cancel_and_wait, schedule_of
from connector.client.runner.read import read_last_add_confirmed, read_range
from metadata.errors import PlacementChangedError
from metadata.model import LedgerMetadata, Versioned
from protos import ledger_pb2 as pb
from metadata.update_loop import update_ledger

log = logging.getLogger(__name__)
MAX_RESTARTS = 5  # closes refused because the stored fragments changed, before the caller is told to retry


async def recover(ctx: Context, current: Versioned[LedgerMetadata], master_key: bytes) -> Versioned[LedgerMetadata]:
    """Fence, read past the LAC, write back, close. Returns the closed metadata (possibly another client's).

    A close refused because the stored fragments changed meanwhile (rule 12) starts over from the stored
    record: the fencing and the reads must cover the fragments as they are now.
    """
    for attempt in range(1, MAX_RESTARTS + 1):
        try:
            return await _recover_once(ctx, current, master_key)
        except RecoveryRestartError:
            if attempt == MAX_RESTARTS:
                raise
            current = await ctx.metadata(ctx.store.read_ledger, current.value.ledger_id)
    raise AssertionError("unreachable")


async def _recover_once(ctx: Context, current: Versioned[LedgerMetadata], master_key: bytes) -> Versioned[LedgerMetadata]:
    store, ledger_id = ctx.store, current.value.ledger_id
    current = await ctx.metadata(update_ledger, store, ledger_id, begin_recovery, current)
    if current.value.is_closed:
        return current
    meta = current.value
    lac = await read_last_add_confirmed(ctx, meta, master_key, fence=True)
    op = RecoveryReadOp(ledger_id, schedule_of(meta), meta.last_fragment.ensemble,
                        recovery_start(meta, lac.last_add_confirmed))
    write_back = AddPipeline(ctx, current, master_key, recovery=True, last_add_confirmed=op.start)
    try:
        futures = await _recovery_reads(ctx, op, master_key, write_back)
        if op.error is not None:
            raise op.error
        for future in futures:
            await asyncio.wrap_future(future)
    except RecoveryIncompleteError:
        raise
    except LedgerError as exc:
        raise RecoveryIncompleteError(
            f"recovery of ledger {ledger_id} could not write back its entries ({exc}); nothing was closed, "
            "retry when the nodes are back") from exc
    finally:
        write_back.stop()
    # The length in bytes of what the dead writer confirmed is not known to a recovery: -1 says so.
    close = close_recovered(op.end, -1, meta.fragments, write_back.current.value.fragments)
    try:
        closed = await ctx.metadata(functools.partial(update_ledger, placement_epoch=write_back.placement_epoch),
                                    store, ledger_id, close, current)
    except PlacementChangedError as exc:   # its write-back chose a node decommissioned since: start over
        raise RecoveryRestartError(f"recovery of ledger {ledger_id}: {exc}") from exc
    metrics.RECOVERIES.inc()
    return closed


async def _recovery_reads(ctx: Context, op: RecoveryReadOp, master_key: bytes,
                          write_back: AddPipeline) -> list[concurrent.futures.Future]:
    futures: list[concurrent.futures.Future] = []
    finished = asyncio.Event()
    tasks: set[asyncio.Task] = set()

    def progress() -> None:
        for _, payload in op.take_recovered():
            futures.append(write_back.append_async(payload))
        for call in op.requests():
            tasks.add(asyncio.ensure_future(read_window(call)))
        if op.done:
            finished.set()

    async def read_window(call: RangeCall) -> None:
        try:
            end = await read_range(ctx, op.ledger_id, call, op.on_entry, fence=True, master_key=master_key,
                                   on_message=progress)
            op.on_range_done(call, end.status, end.reason)
        except Exception as exc:   # whatever ended this window, its node's answer is unknown: never wait on it
            if not isinstance(exc, LedgerError):   # not a node's or ZooKeeper's failure: a bug, kept in the log
                log.exception("recovery of ledger %d: reading from node %s failed", op.ledger_id, call.node)
            op.on_range_done(call, pb.STATUS_UNKNOWN, f"reading from node {call.node} failed: {exc!r}")
        progress()

    progress()
    try:
        await finished.wait()
    finally:
        await cancel_and_wait(tasks)
    return futures
