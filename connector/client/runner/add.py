"""The add pipeline: drives an AddSequence (ops/add.py) over the transport, for a writer or for a recovery's
write-back."""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import threading

from connector.client import metrics
from connector.client.errors import ClientClosedError, LedgerError, NodeError, refuses_ledger
from connector.client.ops.add import AddSequence, PendingAdd
from connector.client.ops.ensemble_change import change_ensemble
from connector.client.placement import Quarantine
from connector.client.runner.context import Context, schedule_of
from metadata.errors import PlacementChangedError
from metadata.model import LedgerMetadata, Versioned
from metadata.update_loop import Transform, update_ledger
from protos import ledger_pb2 as pb
from protos import wire

# A writer without an append for this long sends its LAC to the nodes that lack it (rules 2, 17), so that a tailing
# reader sees the last entry about this soon after its append (plus the nodes' fsync), at any rate of appends: a
# writer that appends more often sends none (every add carries the LAC).
IDLE_LAC_AFTER = 0.025
LAC_RETRY_AFTER = 1.0  # seconds before an explicit LAC a node did not take is sent to it again
TICK = 0.1


class AddPipeline:
    """Sends adds in batches, completes futures in entry order, changes the ensemble when a node fails
    (rule 3), times out silent nodes, and publishes the LAC of an idle writer.

    current is the metadata the pipeline writes by. A writer stores each ensemble change at once (rule 3).
    A recovery's write-back (recovery=True) keeps its changes in memory: current is then the record the
    recovery read, still at the version read, plus its own fragments, which only the recovery's closing
    compare-and-set stores (rule 12).

    Created on the loop. append_async and append_many_async may be called from any thread.
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
        # last entry id of each queued append -> (its future, the first entry id of a batch or None)
        self._futures: dict[int, tuple[concurrent.futures.Future, int | None]] = {}
        self._drained = asyncio.Event()
        self._drained.set()
        self._incoming: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._flush_scheduled = False
        self._changing = False
        self._quarantine = Quarantine()  # nodes that failed recently, not chosen as replacements meanwhile
        self.placement_epoch: int | None = None   # a recovery's: that of its first ensemble change (_apply)
        self._last_append = self.loop.time()
        self._lac_sending: dict[str, float] = {}  # node -> when its explicit LAC may be sent (again)
        self._lac_timer: asyncio.TimerHandle | None = None
        self._stopped = False
        ctx.transport.register(meta.ledger_id, recovery, self)
        self._ticker = asyncio.ensure_future(self._tick())

    @property
    def ledger_id(self) -> int:
        return self.seq.ledger_id

    # -- appending ---------------------------------------------------------------------------------------------

    def append_async(self, payload: bytes) -> concurrent.futures.Future:
        return self._queue((bytes(payload),))

    def append_many_async(self, payloads) -> concurrent.futures.Future:
        """One future for several adds: the list of their entry ids, once the last is acknowledged (adds
        complete in entry order, so every one before it is too); the first failure fails it."""
        return self._queue(tuple(bytes(p) for p in payloads), many=True)

    def _queue(self, payloads: tuple[bytes, ...], many: bool = False) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_running_or_notify_cancel()  # adds cannot be taken back once queued
        if not payloads:
            future.set_result([])
            return future
        if self._stopped:   # its loop may be gone with its client
            future.set_exception(self.seq.error)
            return future
        with self._lock:
            self._incoming.append((payloads, future, many))
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
        now = self.loop.time()
        self._last_append = now
        batches: dict[str, list[bytes]] = collections.defaultdict(list)
        seq = self.seq
        for payloads, future, many in items:
            try:
                adds = seq.append_many(payloads, now)
            except LedgerError as exc:
                future.set_exception(exc)   # the ledger failed: every add queued after it fails too
                continue
            frames = wire.add_requests(self.ledger_id, self.master_key, seq.flags, adds)
            common = seq.common_targets()
            if common is not None:          # every node gets every frame, in entry order
                for node in common:
                    batches[node].extend(frames)
            else:
                for add, frame in zip(adds, frames):
                    for node in seq.targets(add):
                        batches[node].append(frame)
            # The future completes with the last add (in-order completion); a batch's with all its ids.
            self._futures[adds[-1].entry_id] = (future, adds[0].entry_id if many else None)
            self._drained.clear()
        self._send(batches)

    def _send(self, batches: dict[str, list[bytes]]) -> None:
        for node, entries in batches.items():
            self.ctx.transport.send_adds(node, self.recovery, entries)

    # -- answers -----------------------------------------------------------------------------------------------

    def on_add_result(self, node: str, result: pb.AddResult) -> None:
        self._settle(self.seq.on_result(node, result.entry_id, result.status, result.message))

    def on_add_range(self, node: str, first: int, last: int, status: int, message: str) -> None:
        self._settle(self.seq.on_results(node, first, last, status, message))

    def on_node_failure(self, node: str, reason: str) -> None:
        self.seq.on_node_failure(node)
        self._settle([])

    def _fail(self, error: LedgerError) -> None:
        self.seq.fail(error)
        self._settle([])

    def _settle(self, completed: list[PendingAdd]) -> None:
        metrics.adds_completed(completed)
        for add in completed:
            waiting = self._futures.pop(add.entry_id, None)
            if waiting is not None:
                future, first = waiting
                future.set_result(add.entry_id if first is None else list(range(first, add.entry_id + 1)))
        if self.seq.error is not None:
            for future, _ in self._futures.values():
                future.set_exception(self.seq.error)
            self._futures.clear()
        elif self.seq.failed_nodes and not self._changing:
            self._changing = True
            asyncio.ensure_future(self._change_ensemble())
        if not self._futures:
            self._drained.set()
        if completed and not self.recovery:
            self._arm_lac_timer()

    # -- rule 3 ------------------------------------------------------------------------------------------------

    async def _change_ensemble(self) -> None:
        try:
            while self.seq.failed_nodes and self.seq.error is None:
                failed = set(self.seq.failed_nodes)
                placement = await self.ctx.nodes()
                nodes, now = placement.nodes, self.loop.time()
                self._quarantine.add(failed, nodes, now)
                transform = change_ensemble(failed, self.seq.last_add_confirmed + 1, nodes, self.recovery,
                                            exclude=self._quarantine.held(nodes, now))
                try:
                    self.current = await self._apply(transform, placement.epoch)
                except PlacementChangedError:
                    continue    # a node was decommissioned meanwhile: choose again from the nodes as they are
                metrics.ENSEMBLE_CHANGES.inc()
                resends, completed = self.seq.replace_nodes(self.current.value.last_fragment.ensemble,
                                                            self.loop.time())
                batches: dict[str, list[bytes]] = collections.defaultdict(list)
                frames = wire.add_requests(self.ledger_id, self.master_key, self.seq.flags, [add for _, add in resends])
                for (node, _), frame in zip(resends, frames):
                    batches[node].append(frame)
                self._send(batches)
                self._settle(completed)
        except LedgerError as exc:
            self._fail(exc)
        finally:
            self._changing = False
        if self.seq.failed_nodes and self.seq.error is None:  # a failure that arrived while storing
            self._changing = True
            asyncio.ensure_future(self._change_ensemble())

    async def _apply(self, transform: Transform, placement_epoch: int | None) -> Versioned[LedgerMetadata]:
        """A writer stores the change now (rule 3); a recovery keeps it for its closing CAS (rule 12), which
        checks the placement epoch of its first change (placement_epoch, the oldest: epochs only grow)."""
        if self.recovery:
            changed = transform(self.current.value)
            if changed is not None and changed != self.current.value and self.placement_epoch is None:
                self.placement_epoch = placement_epoch
            return Versioned(changed or self.current.value, self.current.version)
        update = functools.partial(update_ledger, placement_epoch=placement_epoch)
        return await self.ctx.metadata(update, self.ctx.store, self.ledger_id, transform, self.current)

    # -- timers ------------------------------------------------------------------------------------------------

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            now = self.loop.time()
            for node in self.seq.timed_out_nodes(now, self.ctx.add_timeout):
                self.on_node_failure(node, "add not acknowledged in time")
            if not self.recovery and now - self._last_append > IDLE_LAC_AFTER:
                self._publish_lac(now)

    def _arm_lac_timer(self) -> None:
        """The LAC moved: publish it once the writer has been idle for IDLE_LAC_AFTER, unless an add carries it."""
        if self._lac_timer is None and not self._stopped:
            delay = max(0.0, self._last_append + IDLE_LAC_AFTER - self.loop.time())
            self._lac_timer = self.loop.call_later(delay, self._on_idle, self._last_append)

    def _on_idle(self, last_append: float) -> None:
        self._lac_timer = None
        if self.seq.pending:
            return   # its completion arms the timer again
        if self._last_append != last_append:
            self._arm_lac_timer()   # appended since the timer was set
        else:
            self._publish_lac(self.loop.time())

    def _publish_lac(self, now: float) -> None:
        """Explicit LAC to each node of the ensemble that does not hold it, retried until it does (rule 17).
        Sends none while an add is in flight (it carries the LAC), nor once the pipeline stopped."""
        if self._stopped:
            return
        lac = self.seq.last_add_confirmed
        for node in self.seq.lac_targets():
            if self._lac_sending.get(node, 0.0) <= now:
                self._lac_sending[node] = float("inf")  # one at a time per node
                asyncio.ensure_future(self._write_lac(node, lac))

    async def _write_lac(self, node: str, lac: int) -> None:
        request = pb.WriteLacRequest(ledger_id=self.ledger_id, master_key=self.master_key, last_add_confirmed=lac)
        retry_at = self.loop.time() + LAC_RETRY_AFTER
        try:
            response = await self.ctx.transport.write_lac(node, request, self.ctx.timeout)
            if response.status == pb.OK:
                self.seq.on_lac_written(node, lac)
                retry_at = 0.0
            elif refuses_ledger(response.status):
                retry_at = float("inf")  # never taken from this writer; its adds learn why
        except NodeError:
            pass  # the LAC is a hint for readers: asked again after LAC_RETRY_AFTER
        finally:
            self._lac_sending[node] = retry_at
        if retry_at == 0.0 and self.seq.last_add_confirmed > lac:
            self._arm_lac_timer()   # the LAC moved on while this one was sent

    async def drain(self) -> None:
        """Wait until every add appended so far completed or failed."""
        while True:
            await asyncio.sleep(0)
            if not self._incoming and not self._flush_scheduled:
                await self._drained.wait()
                if not self._incoming and not self._flush_scheduled:
                    return

    def stop(self) -> None:
        """Stop for good. The adds still waiting, and any queued later, fail with ClientClosedError at once
        instead of waiting forever for answers nothing receives now: whether one that reached a node is in the
        ledger is for its close or recovery to say."""
        # The error first: _queue, on another thread, takes a stopped pipeline's error once it sees _stopped.
        self._fail(ClientClosedError(
            f"ledger {self.ledger_id}: the writer was stopped (its handle or client closed) before this add was "
            "acknowledged; whether it is in the ledger is decided when the ledger is closed or recovered"))
        self._stopped = True
        self._ticker.cancel()
        if self._lac_timer is not None:
            self._lac_timer.cancel()
        self.ctx.transport.unregister(self.ledger_id, self.recovery)
