"""The gRPC StorageNode service: one thin method per RPC, delegating to Storage.

Malformed messages arrive as `Malformed` (see server.py) and get BAD_REQUEST; a node that is not
ready yet, one whose journal broke (it serves nothing until restarted, Storage.refusal), and any unexpected
failure answer ERROR, which clients treat as unknown (rule 8) and as a failure of that node.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import importlib.metadata
import logging
import shutil
import time

import grpc
from grpc_health.v1 import health, health_pb2

from protos import ledger_pb2 as pb
from protos import wire
from storage_node.config import NodeConfig
from storage_node.storage import AddRun, FirstSight, LacAnswer, Storage, id_problem, runs_of

SERVICE_NAME = "ledger.v1.StorageNode"
READ_RANGE_BYTES = 2 << 20       # default batch of a ReadRange message: under gRPC's 4 MiB client default
_RANGE_HEAD = pb.ReadRangeResponse(status=pb.OK).SerializeToString()
_RANGE_DONE = pb.ReadRangeResponse(done=True).SerializeToString()
MAX_PENDING_ADD_MESSAGES = 256   # per stream: stop reading when this many batches wait for their fsync
MAX_HEALTH_WATCHES = 256         # health Watch streams open at once (probes Check; gRPC's client-side checks Watch)
_log = logging.getLogger(__name__)


# What an Add stream answers for a request, or the part of one: (whether to answer in ranges, the answers, the
# journal group to await or None).
_Answers = tuple[bool, list[AddRun], object]


@dataclasses.dataclass(frozen=True)
class Malformed:
    """A request that could not be parsed."""

    reason: str


def _version() -> str:
    try:
        return importlib.metadata.version("ledger-store")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _answers_error(response_type):
    """Unary RPCs: a bug or an I/O surprise becomes an ERROR answer, never a crash or a negative."""
    def wrap(method):
        @functools.wraps(method)
        async def guarded(self, request, context):
            if isinstance(request, Malformed):
                return response_type(status=pb.BAD_REQUEST, message=request.reason)
            refusal = self.storage.refusal()
            if refusal:
                return response_type(status=pb.ERROR, message=refusal)
            try:
                response = await method(self, request, context)
            except Exception as exc:
                _log.exception("%s failed", method.__name__)
                return response_type(status=pb.ERROR, message=f"node {self.config.node_id} failed: {exc!r}")
            refusal = self.storage.refusal()   # the journal broke while it waited (a fence, a LAC long poll)
            return response_type(status=pb.ERROR, message=refusal) if refusal else response
        return guarded
    return wrap


class HealthService(health.aio.HealthServicer):
    """The standard health service, with at most MAX_HEALTH_WATCHES Watch streams open: it needs no token (load
    balancers probe without one), so without a bound of its own anyone who can connect could hold every call
    --max-concurrent-rpcs allows open in Watch streams and shut the clients out."""

    def __init__(self) -> None:
        super().__init__()
        self._watching = 0

    async def Watch(self, request, context) -> None:
        if self._watching >= MAX_HEALTH_WATCHES:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{MAX_HEALTH_WATCHES} health Watch streams are open on this node: use Check")
        self._watching += 1
        try:
            await super().Watch(request, context)
        finally:
            self._watching -= 1


class StorageNodeService:
    def __init__(self, storage: Storage, config: NodeConfig):
        self.storage = storage
        self.config = config
        self.address = ""
        self.health = HealthService()
        self._version = _version()

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    # -- Add ----------------------------------------------------------------------------------

    async def Add(self, request_iterator, context) -> None:
        """Reads batches while earlier ones wait for their fsync; one AddResponse per group commit, or sooner
        where the answers change form (ranges for requests that asked for them, results for the others).

        Entries of ledgers new to the node wait for the first-sight key check (storage_node/key_check.py) on their
        own, in `checking`, and are answered in a later message: the rest of their request, and the requests after
        it, are journaled and answered meanwhile (a client shares one stream between its ledgers, so a slow
        ZooKeeper must not hold up the ledgers a node holds). Those set-aside parts are journaled in the order they
        arrived, so the entries of a ledger are journaled in the order the stream sent them."""
        pending: collections.deque = collections.deque()
        checking: set[asyncio.Task] = set()
        arrived = asyncio.Event()
        drained = asyncio.Event()
        reader = asyncio.ensure_future(self._read_adds(request_iterator, pending, checking, arrived, drained))
        try:
            while True:
                if not pending:
                    if reader.done() and not checking:
                        break
                    arrived.clear()
                    await arrived.wait()
                    continue
                runs: list[AddRun] = []
                ranged = pending[0][0]
                while pending:
                    as_ranges, answers, group = pending[0]
                    if runs and (as_ranges != ranged or (group is not None and not group.done.done())):
                        break
                    pending.popleft()
                    error = (await group.outcome()) if group is not None else None
                    _gather(runs, answers, error)
                drained.set()
                await context.write(_response(runs, ranged))
        finally:
            reader.cancel()
            for task in checking:
                task.cancel()

    async def _read_adds(self, request_iterator, pending: collections.deque, checking: set[asyncio.Task],
                         arrived: asyncio.Event, drained: asyncio.Event) -> None:
        set_aside = None      # the part of a request that waits for the key check last set aside
        waiting: collections.Counter = collections.Counter()   # ledger id -> its parts set aside, not journaled yet
        try:
            async for request in request_iterator:
                split = (None if isinstance(request, Malformed) or self.storage.refusal()
                         else self.storage.new_ledger_entries(request.entries, waiting))
                if split is None:
                    pending.append(self._add(request))
                else:
                    held, new = split
                    ledgers = {e.ledger_id for e in new}
                    waiting.update(ledgers)
                    task = set_aside = asyncio.ensure_future(
                        self._add_new(request.range_results, new, pending, arrived, after=set_aside))
                    checking.add(task)

                    def journaled(done, ledgers=ledgers) -> None:
                        checking.discard(done)
                        waiting.subtract(ledgers)
                        for ledger_id in ledgers:
                            if waiting[ledger_id] <= 0:
                                del waiting[ledger_id]
                        arrived.set()
                    task.add_done_callback(journaled)
                    if held:
                        pending.append(self._add_entries(request.range_results, held))
                arrived.set()
                while len(pending) + len(checking) >= MAX_PENDING_ADD_MESSAGES:
                    drained.clear()
                    await drained.wait()
        finally:
            arrived.set()

    async def _add_new(self, ranged: bool, entries: list, pending: collections.deque, arrived: asyncio.Event,
                       after: asyncio.Task | None) -> None:
        """Entries of ledgers new to the node: journaled once the key check answered for their ledgers and the
        part set aside before them (after) is journaled."""
        try:
            first_sight = await self.storage.first_sight_verdicts(entries)
        except Exception:
            _log.exception("first-sight key check failed")
            first_sight = {}        # add_runs refuses what has no verdict: ERROR, nothing bound unchecked
        if after is not None:
            await asyncio.wait([after])
        pending.append(self._add_entries(ranged, entries, first_sight))
        arrived.set()

    def _add(self, request) -> _Answers:
        if isinstance(request, Malformed):
            return False, [AddRun(-1, -1, -1, pb.BAD_REQUEST, request.reason)], None
        return self._add_entries(request.range_results, request.entries)

    def _add_entries(self, ranged: bool, entries, first_sight: FirstSight | None = None) -> _Answers:
        refusal = self.storage.refusal()
        if refusal:
            return ranged, runs_of(entries, pb.ERROR, refusal), None
        try:
            return (ranged, *self.storage.add_runs(entries, first_sight))
        except Exception as exc:
            _log.exception("Add failed")
            return ranged, runs_of(entries, pb.ERROR, f"node {self.config.node_id} failed: {exc!r}"), None

    # -- reads, fencing, LAC --------------------------------------------------------------------

    @_answers_error(pb.ReadResponse)
    async def Read(self, request, context) -> pb.ReadResponse:
        ledger_id, entry_id = request.ledger_id, request.entry_id
        problem = id_problem(ledger_id, entry_id)
        if problem:
            return pb.ReadResponse(status=pb.BAD_REQUEST, message=problem, ledger_id=ledger_id, entry_id=entry_id)
        if request.fence:
            verdict = await self.storage.fence(ledger_id, request.master_key)
            if verdict:
                return pb.ReadResponse(status=verdict.status, message=verdict.message, ledger_id=ledger_id,
                                       entry_id=entry_id)
        started = time.perf_counter()
        status, message, lac, payload, digest = self.storage.read_entry(ledger_id, entry_id)
        self.storage.metrics.read_done(status == pb.OK, len(payload), time.perf_counter() - started)
        return pb.ReadResponse(status=status, message=message, ledger_id=ledger_id, entry_id=entry_id,
                               last_add_confirmed=lac, payload=bytes(payload), digest=digest)

    async def ReadRange(self, request, context):
        try:
            async for response in self._read_range(request):
                yield response
        except Exception as exc:
            _log.exception("ReadRange failed")
            yield pb.ReadRangeResponse(status=pb.ERROR, message=f"node {self.config.node_id} failed: {exc!r}",
                                       done=True)

    async def _read_range(self, request):
        if isinstance(request, Malformed):
            yield pb.ReadRangeResponse(status=pb.BAD_REQUEST, message=request.reason, done=True)
            return
        refusal = self.storage.refusal()
        if refusal:
            yield pb.ReadRangeResponse(status=pb.ERROR, message=refusal, done=True)
            return
        ledger_id, first, last = request.ledger_id, request.first_entry_id, request.last_entry_id
        if id_problem(ledger_id) or first < 0 or last < first or request.max_bytes_per_message < 0:
            yield pb.ReadRangeResponse(status=pb.BAD_REQUEST, done=True,
                                       message=f"bad ledger id {ledger_id}, range [{first}, {last}] or "
                                               f"max_bytes_per_message {request.max_bytes_per_message}")
            return
        if request.fence:
            verdict = await self.storage.fence(ledger_id, request.master_key)
            if verdict:
                yield pb.ReadRangeResponse(status=verdict.status, message=verdict.message, done=True)
                return
            refusal = self.storage.refusal()   # the journal broke while the fence waited for its fsync
            if refusal:
                yield pb.ReadRangeResponse(status=pb.ERROR, message=refusal, done=True)
                return
        status, message, _, _ = self.storage.last_confirmed(ledger_id)
        if status != pb.OK:
            yield pb.ReadRangeResponse(status=status, message=message, done=True)
            return
        limit = min(request.max_bytes_per_message or READ_RANGE_BYTES, self.config.max_request_bytes)
        # Each message is encoded here, payloads copied once from the records read (protos/wire.py).
        parts, size = [_RANGE_HEAD], 0
        started, entries, total = time.perf_counter(), 0, 0
        for entry_id, (status, message, lac, payload, digest) in self.storage.read_range(ledger_id, first, last):
            if size + len(payload) > limit and len(parts) > 1:
                yield b"".join(parts)
                parts, size = [_RANGE_HEAD], 0
                refusal = self.storage.refusal()
                if refusal:   # broke meanwhile: the entries not sent are unknown to the client (rule 11)
                    yield pb.ReadRangeResponse(status=pb.ERROR, message=refusal, done=True)
                    return
            parts += wire.read_range_entry(status, message, ledger_id, entry_id, lac, digest, payload)
            size += len(payload)
            entries += status == pb.OK
            total += len(payload)
        parts.append(_RANGE_DONE)
        self.storage.metrics.read_done(entries, total, time.perf_counter() - started)
        yield b"".join(parts)

    @_answers_error(pb.ReadLacResponse)
    async def ReadLac(self, request, context) -> pb.ReadLacResponse:
        if id_problem(request.ledger_id):
            return _lac_response(LacAnswer(pb.BAD_REQUEST, id_problem(request.ledger_id)))
        if request.fence:
            verdict = await self.storage.fence(request.ledger_id, request.master_key)
            if verdict:
                return _lac_response(LacAnswer(*verdict))
        return _lac_response(self.storage.last_confirmed(request.ledger_id))

    @_answers_error(pb.WriteLacResponse)
    async def WriteLac(self, request, context) -> pb.WriteLacResponse:
        verdict = await self.storage.write_lac(request.ledger_id, request.master_key, request.last_add_confirmed)
        if verdict:
            return pb.WriteLacResponse(status=verdict.status, message=verdict.message)
        return pb.WriteLacResponse(status=pb.OK)

    @_answers_error(pb.ReadLacResponse)
    async def WaitLac(self, request, context) -> pb.ReadLacResponse:
        if id_problem(request.ledger_id):
            return _lac_response(LacAnswer(pb.BAD_REQUEST, id_problem(request.ledger_id)))
        return _lac_response(
            await self.storage.wait_lac(request.ledger_id, request.previous_lac, request.timeout_ms)
        )

    async def NodeInfo(self, request, context) -> pb.NodeInfoResponse:
        disk = shutil.disk_usage(self.config.data_dir)
        storage = self.storage
        journal = storage.journal
        return pb.NodeInfoResponse(
            node_id=self.config.node_id,
            address=self.address,
            read_only=bool(storage.read_only_reason or storage.broken),     # a broken node takes no adds either
            read_only_reason="; ".join(r for r in (storage.read_only_reason, storage.broken and storage.health) if r),
            disk_total_bytes=disk.total,
            disk_used_bytes=disk.total - disk.free,
            ledger_count=len(storage.ledgers),
            entry_count=storage.entry_count(),
            version=self._version,
            max_entry_bytes=self.config.max_entry_bytes,
            max_request_bytes=self.config.max_request_bytes,
            journal_fsyncs=journal.fsyncs if journal else 0,
            journal_records=journal.records if journal else 0,
        )


def _gather(runs: list[AddRun], answers: list[AddRun], error) -> None:
    """Append a request's answers to a response's runs: OK ones as ERROR when their group failed (rule 5),
    the first joined to the last one before it where it continues it."""
    if error is not None:
        lost = f"not durable, retry: {error}"
        answers = [a._replace(status=pb.ERROR, message=lost) if a.status == pb.OK else a for a in answers]
    if runs and answers:
        last, first = runs[-1], answers[0]
        if (first.first_entry_id == last.last_entry_id + 1 and first.ledger_id == last.ledger_id
                and first.status == last.status and first.message == last.message):
            runs[-1] = last._replace(last_entry_id=first.last_entry_id)
            answers = answers[1:]
    runs.extend(answers)


def _response(runs: list[AddRun], ranged: bool) -> pb.AddResponse:
    """The answers as ranges, or as one AddResult per entry for a client that did not ask for ranges."""
    response = pb.AddResponse()
    if ranged:
        add = response.ranges.add
        for ledger_id, first, last, status, message in runs:
            add(ledger_id=ledger_id, first_entry_id=first, last_entry_id=last, status=status, message=message)
    else:
        add = response.results.add
        for ledger_id, first, last, status, message in runs:
            for entry_id in range(first, last + 1):
                add(ledger_id=ledger_id, entry_id=entry_id, status=status, message=message)
    return response


def _lac_response(answer: LacAnswer) -> pb.ReadLacResponse:
    return pb.ReadLacResponse(status=answer.status, message=answer.message, last_entry_id=answer.last_entry_id,
                              last_add_confirmed=answer.lac)
