"""Carries out the ops' instructions over the transport, on the client's background event loop.

The ops (connector/client/ops) decide; this module sends what they ask for, feeds them the answers and
waits for their outcome. Metadata updates (blocking kazoo calls) run in worker threads.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import threading
import time
from typing import Awaitable, TypeVar

from connector.client import metrics
from connector.client.errors import LedgerClosedError, LedgerError, NodeError, RecoveryIncompleteError
from connector.client.ops.add import AddSequence, PendingAdd
from connector.client.ops.close import close_recovered
from connector.client.ops.ensemble_change import change_ensemble
from connector.client.ops.read import ChunkRead, Entry, EntryRead
from connector.client.ops.read_lac import ReadLacOp
from connector.client.ops.recovery import RangeCall, RecoveryReadOp, begin_recovery, recovery_start
from connector.client.schedule import Schedule
from connector.client.transport import Transport
from metadata import registry
from metadata.model import LedgerMetadata, Versioned
from metadata.store import MetadataStore
from metadata.update_loop import update_ledger
from protos import ledger_pb2 as pb
from protos import wire

T = TypeVar("T")

IDLE_LAC_AFTER = 0.2  # seconds without appends before an idle writer sends its LAC explicitly (rule 2)
TICK = 0.1


class Runtime:
    """The client's event loop, on a daemon thread; the public API is synchronous on top of it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="ledger-client", daemon=True)
        self._thread.start()

    def submit(self, coro: Awaitable[T]) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Awaitable[T]) -> T:
        return self.submit(coro).result()

    def stop(self) -> None:
        self.run(self._cancel_tasks())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


    @staticmethod
    async def _cancel_tasks() -> None:
        """Let what is left (calls being cancelled, LAC writes) finish, so nothing dies pending with the loop."""
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclasses.dataclass
class Context:
    store: MetadataStore
    transport: Transport
    timeout: float       # for one read answer, or one fencing answer
    add_timeout: float   # an add a node has not acknowledged after this long counts as that node failing


def schedule_of(meta: LedgerMetadata) -> Schedule:
    return Schedule(meta.ensemble_size, meta.write_quorum, meta.ack_quorum)


def add_entry(ledger_id: int, master_key: bytes, flags: int, add: PendingAdd) -> bytes:
    """The entry's wire frame, sent as is to every node of the write set."""
    return wire.add_request(ledger_id, add.entry_id, master_key, flags, add.last_add_confirmed, add.digest,
                            add.payload)


class AddPipeline:
    """Drives an AddSequence: sends adds in batches, completes futures in entry order, changes the ensemble
    when a node fails (rule 3), times out silent nodes, and publishes the LAC of an idle writer.

    Created on the loop. append_async may be called from any thread.
    """

    def __init__(self, ctx: Context, current: Versioned[LedgerMetadata], master_key: bytes, *,
                 recovery: bool = False, last_add_confirmed: int = -1):
        meta = current.value
        self.ctx = ctx
        self.current = current
        self.master_key = master_key
        self.recovery = recovery
        self.seq = AddSequence(meta.ledger_id, schedule_of(meta), meta.last_fragment.ensemble,
                               last_add_confirmed=last_add_confirmed, recovery=recovery)
        self.loop = asyncio.get_running_loop()
        self._futures: dict[int, concurrent.futures.Future] = {}
        self._drained = asyncio.Event()
        self._drained.set()
        self._incoming: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._flush_scheduled = False
        self._changing = False
        self._ever_failed: set[str] = set()
        self._last_append = time.monotonic()
        ctx.transport.register(meta.ledger_id, recovery, self)
        self._ticker = asyncio.ensure_future(self._tick())

    @property
    def ledger_id(self) -> int:
        return self.seq.ledger_id

    # -- appending ---------------------------------------------------------------------------------------------

    def append_async(self, payload: bytes) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_running_or_notify_cancel()  # adds cannot be taken back once queued
        with self._lock:
            self._incoming.append((bytes(payload), future))
            schedule = not self._flush_scheduled
            self._flush_scheduled = True
        if schedule:
            self.loop.call_soon_threadsafe(self._flush)
        return future

    def _flush(self) -> None:
        with self._lock:
            items = list(self._incoming)
            self._incoming.clear()
            self._flush_scheduled = False
        now = time.monotonic()
        self._last_append = now
        batches: dict[str, list[bytes]] = collections.defaultdict(list)
        for payload, future in items:
            try:
                add, targets = self.seq.append(payload, now)
            except LedgerError as exc:
                future.set_exception(exc)
                continue
            self._futures[add.entry_id] = future
            self._drained.clear()
            entry = add_entry(self.ledger_id, self.master_key, self.seq.flags, add)
            for node in targets:
                batches[node].append(entry)
        self._send(batches)

    def _send(self, batches: dict[str, list[bytes]]) -> None:
        for node, entries in batches.items():
            self.ctx.transport.send_adds(node, self.recovery, entries)

    # -- answers -----------------------------------------------------------------------------------------------

    def on_add_result(self, node: str, result: pb.AddResult) -> None:
        self._settle(self.seq.on_result(node, result.entry_id, result.status, result.message))

    def on_node_failure(self, node: str, reason: str) -> None:
        self.seq.on_node_failure(node)
        self._settle([])

    def _settle(self, completed: list[PendingAdd]) -> None:
        metrics.adds_completed(completed)
        for add in completed:
            self._futures.pop(add.entry_id).set_result(add.entry_id)
        if self.seq.error is not None:
            self.seq.fail(self.seq.error)
            for future in self._futures.values():
                future.set_exception(self.seq.error)
            self._futures.clear()
        elif self.seq.failed_nodes and not self._changing:
            self._changing = True
            asyncio.ensure_future(self._change_ensemble())
        if not self._futures:
            self._drained.set()

    # -- rule 3 ------------------------------------------------------------------------------------------------

    async def _change_ensemble(self) -> None:
        try:
            while self.seq.failed_nodes and self.seq.error is None:
                failed = set(self.seq.failed_nodes)
                self._ever_failed |= failed
                self.current = await asyncio.to_thread(self._store_change, failed)
                metrics.ENSEMBLE_CHANGES.inc()
                resends, completed = self.seq.replace_nodes(self.current.value.last_fragment.ensemble,
                                                            time.monotonic())
                batches: dict[str, list[bytes]] = collections.defaultdict(list)
                for node, add in resends:
                    batches[node].append(add_entry(self.ledger_id, self.master_key, self.seq.flags, add))
                self._send(batches)
                self._settle(completed)
        except LedgerError as exc:
            self.seq.error = exc
            self._settle([])
        finally:
            self._changing = False
        if self.seq.failed_nodes and self.seq.error is None:  # a failure that arrived while storing
            self._changing = True
            asyncio.ensure_future(self._change_ensemble())

    def _store_change(self, failed: set[str]) -> Versioned[LedgerMetadata]:
        nodes = registry.placeable_nodes(self.ctx.store)
        transform = change_ensemble(failed, self.seq.last_add_confirmed + 1, nodes, self.recovery,
                                    exclude=self._ever_failed)
        return update_ledger(self.ctx.store, self.ledger_id, transform, current=self.current)

    # -- timers ------------------------------------------------------------------------------------------------

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            now = time.monotonic()
            for node in self.seq.timed_out_nodes(now, self.ctx.add_timeout):
                self.on_node_failure(node, "add not acknowledged in time")
            if not self.recovery and now - self._last_append > IDLE_LAC_AFTER:
                lac = self.seq.lac_to_publish()
                if lac is not None:
                    for node in self.seq.ensemble:
                        asyncio.ensure_future(self._write_lac(node, lac))

    async def _write_lac(self, node: str, lac: int) -> None:
        request = pb.WriteLacRequest(ledger_id=self.ledger_id, master_key=self.master_key, last_add_confirmed=lac)
        try:
            await self.ctx.transport.write_lac(node, request, self.ctx.timeout)
        except NodeError:
            pass  # the LAC is a hint for readers; the next add carries it anyway

    async def drain(self) -> None:
        """Wait until every add appended so far completed or failed."""
        while True:
            await asyncio.sleep(0)
            if not self._incoming and not self._flush_scheduled:
                await self._drained.wait()
                if not self._incoming and not self._flush_scheduled:
                    return

    def stop(self) -> None:
        self._ticker.cancel()
        self.ctx.transport.unregister(self.ledger_id, self.recovery)


# -- reading the LAC (rule 10) -------------------------------------------------------------------------------------

async def read_last_add_confirmed(ctx: Context, meta: LedgerMetadata, master_key: bytes, fence: bool) -> ReadLacOp:
    op = ReadLacOp(meta.ledger_id, schedule_of(meta), meta.last_fragment.ensemble, fence)
    request = pb.ReadLacRequest(ledger_id=meta.ledger_id, fence=fence, master_key=master_key)

    async def ask(node: str) -> None:
        try:
            response = await ctx.transport.read_lac(node, request, ctx.timeout)
            op.on_response(node, response.status, response.last_entry_id, response.last_add_confirmed,
                           response.message)
        except NodeError as exc:
            op.on_failure(node, str(exc))

    await _until(op, [ask(node) for node in op.requests()])
    op.outcome()
    return op


async def _until(op, coroutines: list[Awaitable[None]]) -> None:
    """Run the calls concurrently until op.done, then cancel what is still waiting (a frozen node)."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        pending = set(tasks)
        while pending and not op.done:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


# -- recovery (rules 10-12) ----------------------------------------------------------------------------------------

async def recover(ctx: Context, current: Versioned[LedgerMetadata], master_key: bytes) -> Versioned[LedgerMetadata]:
    """Fence, read past the LAC, write back, close. Returns the closed metadata (possibly another client's)."""
    store, ledger_id = ctx.store, current.value.ledger_id
    current = await asyncio.to_thread(update_ledger, store, ledger_id, begin_recovery, current)
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
        current = write_back.current
    except LedgerClosedError:
        return await asyncio.to_thread(store.read_ledger, ledger_id)  # another recovery closed it first
    except RecoveryIncompleteError:
        raise
    except LedgerError as exc:
        raise RecoveryIncompleteError(
            f"recovery of ledger {ledger_id} could not write back its entries ({exc}); nothing was closed, "
            "retry when the nodes are back") from exc
    finally:
        write_back.stop()
    # The length in bytes of what the dead writer confirmed is not known to a recovery: -1 says so.
    closed = await asyncio.to_thread(update_ledger, store, ledger_id, close_recovered(op.end, -1), current)
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
        request = pb.ReadRangeRequest(ledger_id=op.ledger_id, first_entry_id=call.first_entry_id,
                                      last_entry_id=call.last_entry_id, fence=True, master_key=master_key)
        status, reason = pb.OK, ""
        try:
            async for response in ctx.transport.read_range(call.node, request, ctx.timeout):
                if response.status != pb.OK:
                    status, reason = response.status, response.message
                for entry in response.entries:
                    op.on_entry(call.node, entry)
                progress()
        except NodeError as exc:
            status, reason = pb.STATUS_UNKNOWN, str(exc)
        op.on_range_done(call, status, reason)
        progress()

    progress()
    try:
        await finished.wait()
    finally:
        for task in tasks:
            task.cancel()
    return futures


# -- reading entries -----------------------------------------------------------------------------------------------

async def read_chunk(ctx: Context, chunk: ChunkRead) -> list[Entry]:
    async def range_call(call: RangeCall) -> None:
        request = pb.ReadRangeRequest(ledger_id=chunk.ledger_id, first_entry_id=call.first_entry_id,
                                      last_entry_id=call.last_entry_id)
        reason = ""
        try:
            async for response in ctx.transport.read_range(call.node, request, ctx.timeout):
                if response.status != pb.OK:
                    reason = f"{pb.Status.Name(response.status)} {response.message}".strip()
                for entry in response.entries:
                    chunk.on_entry(call.node, entry)
        except NodeError as exc:
            reason = str(exc)
        chunk.on_call_done(call, reason)

    async def failover(read: EntryRead) -> None:
        request = pb.ReadRequest(ledger_id=chunk.ledger_id, entry_id=read.entry_id)
        while (node := read.next_node()) is not None:
            try:
                read.on_response(node, await ctx.transport.read(node, request, ctx.timeout))
            except NodeError as exc:
                read.on_failure(node, str(exc))
        if read.entry is None:
            raise read.error()
        chunk.entries[read.entry_id] = read.entry

    await asyncio.gather(*(range_call(call) for call in chunk.calls))
    await asyncio.gather(*(failover(read) for read in chunk.failovers()))
    entries = chunk.in_order()
    metrics.entries_read(entries)
    return entries


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
