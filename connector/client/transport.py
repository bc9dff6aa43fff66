"""gRPC to the storage nodes (with runner.py the client's only I/O). Runs on the client's event loop.

One channel per node, addresses from the node registry. Adds travel on one bidi Add stream per node and lane
(normal writes, recovery write-back) shared by every ledger of the client: whatever is queued for a node when
its sender wakes goes out as one AddRequest, so many entries are in flight and batched on the wire. Each
entry is framed once (protos.wire) and the same bytes go to every node of its write set; a frame of
MAX_BATCH_BYTES or more travels alone, and so does one of LONE_FRAME_BYTES or more that is the only one
queued, without being copied into a batch (a Spark write task's entries, about 250 KiB compressed, are mostly
queued one at a time). A batch asks the node to answer
in ranges (AddRequest.range_results: one AddRange for a run of acknowledged entries instead of an AddResult
each); a frame that travels alone, or a node that predates ranges, gets results. Both are routed to the
ledger's sink, a range in one call. gRPC retries only the idempotent reads; adds and fences are retried, or
not, by the ops.
"""
from __future__ import annotations

import asyncio
import json
import math
import time
from typing import AsyncIterator, Callable, Mapping, Protocol

import grpc

from connector.client.errors import NodeError
from connector.client.limits import MAX_MESSAGE_BYTES
from connector.client.security import TlsConfig, call_metadata
from metadata import registry
from metadata.errors import MetadataError
from metadata.model import NodeRegistration
from metadata.store import MetadataStore
from protos import ledger_pb2 as pb
from protos import wire
from protos.ledger_pb2_grpc import StorageNodeStub

MAX_BATCH_BYTES = 1024 * 1024
LONE_FRAME_BYTES = 64 * 1024   # a frame queued alone is sent as it is from this size on (no copy to add the flag)
ADDRESS_READ_SECONDS = 0.25    # the most a new channel's address read may hold the loop; then the listed address
# The most the listing for a node not listed yet may hold the loop (the registrations read at once, pipelined): it
# has no address to fall back on, and failing counts as the node failing (a writer replaces it), so it waits for a
# slow ZooKeeper (a loaded machine) longer than a re-read does, but not for one that is cut off.
ADDRESS_LIST_SECONDS = 5.0
# A node's address listed this recently is dialled as listed, not read again, for the node's first channel after the
# listing: a new client's channels to the nodes it just listed (or that its ledger's creation just read:
# GrpcTransport's `listed`) cost no round trip each. A channel made again (the node failed) reads it again.
ADDRESS_FRESH_SECONDS = 0.5

# ReadRange's method path, its answers decoded by protos.wire (big payloads are views into the message, not copies)
_READ_RANGE = "/{0.containing_service.full_name}/{0.name}".format(
    pb.DESCRIPTOR.services_by_name["StorageNode"].methods_by_name["ReadRange"])

# Idempotent reads only; UNAVAILABLE covers a node that is restarting.
_READ_RETRY = json.dumps({"methodConfig": [{
    "name": [{"service": "ledger.v1.StorageNode", "method": m} for m in ("Read", "ReadLac", "NodeInfo")],
    "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.05s", "maxBackoff": "0.5s", "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"]},
}]})


class AddSink(Protocol):
    """Where a ledger's add results go (runner.AddPipeline)."""

    def on_add_result(self, node: str, result: pb.AddResult) -> None: ...

    def on_add_range(self, node: str, first: int, last: int, status: int, message: str) -> None:
        """The same answer for entries first..last (an AddRange): what on_add_result for each would say."""

    def on_node_failure(self, node: str, reason: str) -> None: ...


class Transport(Protocol):
    """What the runner needs from the network; GrpcTransport here, a scripted fake in the race tests."""

    def register(self, ledger_id: int, recovery: bool, sink: AddSink) -> None: ...

    def unregister(self, ledger_id: int, recovery: bool) -> None: ...

    def send_adds(self, node: str, recovery: bool, entries: list[bytes]) -> None:
        """entries: one-entry AddRequests from protos.wire.add_request, the same bytes for every node."""

    async def read_lac(self, node: str, request: pb.ReadLacRequest, timeout: float) -> pb.ReadLacResponse: ...

    async def read(self, node: str, request: pb.ReadRequest, timeout: float) -> pb.ReadResponse: ...

    def read_range(self, node: str, request: pb.ReadRangeRequest,
                   timeout: float) -> AsyncIterator[pb.ReadRangeResponse | wire.ReadRangeResponseView]: ...

    async def write_lac(self, node: str, request: pb.WriteLacRequest, timeout: float) -> pb.WriteLacResponse: ...

    async def wait_lac(self, node: str, request: pb.WaitLacRequest, timeout: float) -> pb.ReadLacResponse: ...


class _AddStream:
    """One Add bidi stream to a node: a sender task that batches whatever is queued, a receiver that routes."""

    def __init__(self, node: str, stub: grpc.aio.StreamStreamCall, route: Callable[[pb.AddResponse], None],
                 on_broken: Callable[[str], None]):
        self.node = node
        self.queue: list[bytes] = []
        self.queued_bytes = 0
        self.wakeup = asyncio.Event()
        self.call = stub
        self.broken = False
        self._route = route
        self._on_broken = on_broken
        self._tasks = [asyncio.create_task(self._send()), asyncio.create_task(self._receive())]

    def send(self, entries: list[bytes]) -> None:
        self.queue.extend(entries)
        self.queued_bytes += sum(map(len, entries))
        self.wakeup.set()

    async def _send(self) -> None:
        try:
            while True:
                await self.wakeup.wait()
                self.wakeup.clear()
                while self.queue:
                    batch, self.queue = self._take_batch()
                    if len(batch) == 1 and len(batch[0]) >= LONE_FRAME_BYTES:
                        await self.call.write(batch[0])     # not copied to add the flag: one entry, one result
                    else:
                        batch.append(wire.RANGE_RESULTS)
                        await self.call.write(b"".join(batch))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the stream is gone: every ledger using it must replace the node
            self._break(f"add stream failed: {_describe(exc)}")

    def _take_batch(self) -> tuple[list[bytes], list[bytes]]:
        """The queue's first MAX_BATCH_BYTES (at least one frame), and the rest."""
        if self.queued_bytes <= MAX_BATCH_BYTES:
            self.queued_bytes = 0
            return self.queue, []
        size = 0
        for index, entry in enumerate(self.queue):
            size += len(entry)
            if index and size > MAX_BATCH_BYTES:
                self.queued_bytes -= size - len(entry)
                return self.queue[:index], self.queue[index:]
        self.queued_bytes = 0
        return self.queue, []

    async def _receive(self) -> None:
        try:
            while True:
                response = await self.call.read()
                if response is grpc.aio.EOF:
                    raise NodeError(f"node {self.node} ended the add stream")
                self._route(response)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._break(f"add stream failed: {_describe(exc)}")

    def _break(self, reason: str) -> None:
        if self.broken:
            return
        self.broken = True
        self.call.cancel()
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        self._on_broken(reason)

    def close(self) -> None:
        self.broken = True
        self.call.cancel()
        for task in self._tasks:
            task.cancel()


class GrpcTransport:
    """tls: verify nodes (and present a client certificate) over TLS; auth_token: sent with every call;
    node_addresses: node id -> the address to dial instead of the registered one (a proxy in front of it);
    listed: the nodes' registrations as the client read them, and when (time.monotonic()), taken as a listing."""

    def __init__(self, store: MetadataStore, tls: TlsConfig | None = None, auth_token: str | None = None,
                 node_addresses: Mapping[str, str] | None = None,
                 listed: tuple[Mapping[str, NodeRegistration], float] | None = None):
        self._store = store
        self._address_map = dict(node_addresses or {})
        self._credentials = tls.channel_credentials() if tls is not None else None
        self._metadata = call_metadata(auth_token)
        self._addresses: dict[str, str] = {}
        self._fresh: dict[str, float] = {}   # node -> when its listed address was read, until its first channel
        if listed is not None:
            self._take_listing(*listed)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._streams: dict[tuple[str, bool], _AddStream] = {}
        self._stream_channels: dict[tuple[str, bool], grpc.aio.Channel] = {}  # the channel each stream runs on
        self._retired: list[grpc.aio.Channel] = []   # forgotten, closed once no add stream runs on them
        self._sinks: dict[bool, dict[int, AddSink]] = {False: {}, True: {}}

    # -- adds --------------------------------------------------------------------------------------------------

    def register(self, ledger_id: int, recovery: bool, sink: AddSink) -> None:
        self._sinks[recovery][ledger_id] = sink

    def unregister(self, ledger_id: int, recovery: bool) -> None:
        self._sinks[recovery].pop(ledger_id, None)

    def send_adds(self, node: str, recovery: bool, entries: list[bytes]) -> None:
        stream = self._streams.get((node, recovery))
        if stream is None or stream.broken:
            try:
                channel = self._channel(node)
                call = channel.stream_stream(
                    "/ledger.v1.StorageNode/Add", request_serializer=None,
                    response_deserializer=pb.AddResponse.FromString)(metadata=self._metadata)
            except NodeError as exc:
                self._fail_node(node, recovery, str(exc))
                return
            stream = _AddStream(node, call, lambda response: self._route(node, recovery, response),
                                lambda reason: self._stream_broken(node, recovery, reason))
            self._streams[(node, recovery)] = stream
            self._stream_channels[(node, recovery)] = channel
            self._close_retired()
        stream.send(entries)

    def _route(self, node: str, recovery: bool, response: pb.AddResponse) -> None:
        sinks = self._sinks[recovery]
        for answer in response.ranges:
            sink = sinks.get(answer.ledger_id)
            if sink is not None:
                sink.on_add_range(node, answer.first_entry_id, answer.last_entry_id, answer.status, answer.message)
        for result in response.results:
            sink = sinks.get(result.ledger_id)
            if sink is not None:
                sink.on_add_result(node, result)

    def _stream_broken(self, node: str, recovery: bool, reason: str) -> None:
        self._streams.pop((node, recovery), None)
        self._stream_channels.pop((node, recovery), None)
        self._forget(node)
        self._close_retired()
        self._fail_node(node, recovery, reason)

    def _fail_node(self, node: str, recovery: bool, reason: str) -> None:
        for sink in list(self._sinks[recovery].values()):
            sink.on_node_failure(node, reason)

    # -- unary and streaming reads -----------------------------------------------------------------------------

    async def read_lac(self, node: str, request: pb.ReadLacRequest, timeout: float) -> pb.ReadLacResponse:
        return await self._unary(node, "ReadLac", request, timeout)

    async def read(self, node: str, request: pb.ReadRequest, timeout: float) -> pb.ReadResponse:
        return await self._unary(node, "Read", request, timeout)

    async def write_lac(self, node: str, request: pb.WriteLacRequest, timeout: float) -> pb.WriteLacResponse:
        return await self._unary(node, "WriteLac", request, timeout)

    async def wait_lac(self, node: str, request: pb.WaitLacRequest, timeout: float) -> pb.ReadLacResponse:
        return await self._unary(node, "WaitLac", request, timeout)

    async def read_range(self, node: str, request: pb.ReadRangeRequest,
                         timeout: float) -> AsyncIterator[pb.ReadRangeResponse | wire.ReadRangeResponseView]:
        """Responses of one ReadRange; timeout bounds the wait for each message, not the whole stream.

        The wait is asyncio.timeout, not wait_for: Python 3.11's wait_for returns a message that arrived as its task
        was cancelled and drops the cancellation, so a ReadRange a read had cancelled (a speculative read's loser)
        streamed on to its end, or to its node's deadline."""
        call = self._channel(node).unary_stream(
            _READ_RANGE, request_serializer=pb.ReadRangeRequest.SerializeToString,
            response_deserializer=wire.read_range_message, _registered_method=True)(request, metadata=self._metadata)
        try:
            while True:
                async with asyncio.timeout(timeout):
                    response = await call.read()
                if response is grpc.aio.EOF:
                    return
                if response is None:   # gRPC logs a deserializer's exception and hands on None
                    raise NodeError(f"node {node}: ReadRange sent a message that does not decode")
                yield response
        except (grpc.aio.AioRpcError, asyncio.TimeoutError) as exc:
            raise self._failed(node, "ReadRange", exc) from exc
        except asyncio.CancelledError:
            if _caller_cancelled():
                raise
            raise _cut_off(node, "ReadRange") from None
        finally:
            call.cancel()

    async def _unary(self, node: str, method: str, request, timeout: float):
        try:
            return await getattr(self._stub(node), method)(request, timeout=timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise self._failed(node, method, exc) from exc
        except asyncio.CancelledError:
            if _caller_cancelled():
                raise
            raise _cut_off(node, method) from None

    def _failed(self, node: str, method: str, exc: Exception) -> NodeError:
        """A call to node failed: if it found the node UNAVAILABLE (gone, or restarted elsewhere), its channel is
        forgotten, so the next call dials the address the node registers then."""
        if isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE:
            self._forget(node)
        return NodeError(f"node {node}: {method} failed: {_describe(exc)}")

    # -- channels ----------------------------------------------------------------------------------------------

    def _stub(self, node: str) -> StorageNodeStub:
        return StorageNodeStub(self._channel(node))

    def _channel(self, node: str) -> grpc.aio.Channel:
        channel = self._channels.get(node)
        if channel is None:
            address = self._lookup(node)
            options = [
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.service_config", _READ_RETRY),
                ("grpc.enable_retries", 1),
            ]
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(address, options=options)
            else:
                channel = grpc.aio.secure_channel(address, self._credentials, options=options)
            self._channels[node] = channel
        return channel

    def _lookup(self, node: str) -> str:
        """The address to dial for a new channel to node: the one it registers now. A node not listed yet has them
        all listed (a blocking ZooKeeper read on the loop, but only for the first node used, or a node new since),
        so that their addresses are known while ZooKeeper is away, when it is never read (it would hold up every
        call of the loop until it is back). A node listed before (a failed one too) is read again, because it may
        have restarted elsewhere since (a new port or host), unless this is its first channel within
        ADDRESS_FRESH_SECONDS of the listing: a read that waits at most ADDRESS_READ_SECONDS,
        after which the listed address is dialled. The listing waits at most ADDRESS_LIST_SECONDS, and fails as the
        node failing (NodeError: the caller moves to another node, a recovery counts its answer unknown); any other
        error would end the caller's task instead."""
        if not self._store.connected:
            address = self._addresses.get(node) or self._address_map.get(node)
            if address is None:
                raise NodeError(f"storage node {node}: its address is unknown while ZooKeeper is unreachable; "
                                "the client moves to another node")
            return address
        if node in self._addresses:
            if time.monotonic() - self._fresh.pop(node, -math.inf) < ADDRESS_FRESH_SECONDS:
                return self._addresses[node]
            try:
                registration = registry.read_node(self._store, node, within=ADDRESS_READ_SECONDS)
            except MetadataError:
                return self._addresses[node]
            if registration is None:
                self._addresses.pop(node)
            else:
                self._addresses[node] = self._address_map.get(node, registration.address)
        else:
            try:
                listed_at = time.monotonic()
                listed = registry.list_nodes(self._store, within=ADDRESS_LIST_SECONDS)
            except MetadataError as exc:
                raise NodeError(f"storage node {node}: its address could not be read from ZooKeeper in time ({exc}); "
                                "the client moves to another node") from exc
            self._take_listing(listed, listed_at)
            self._fresh.pop(node, None)   # this channel's address is the listing's: a later one reads it again
        if node not in self._addresses:
            raise NodeError(f"storage node {node} is not registered (down?); the client moves to another node")
        return self._addresses[node]

    def _take_listing(self, listed: Mapping[str, NodeRegistration], listed_at: float) -> None:
        self._addresses = {n: self._address_map.get(n, reg.address) for n, reg in listed.items()}
        self._fresh = dict.fromkeys(self._addresses, listed_at)

    def _forget(self, node: str) -> None:
        """Drop the channel to a node that failed; the next one is opened at the address it registers then (its
        address is kept to fall back on: _lookup)."""
        channel = self._channels.pop(node, None)
        if channel is not None:
            self._retired.append(channel)
            self._close_retired()

    def _close_retired(self) -> None:
        """Close the forgotten channels no add stream runs on any more. One that still carries a stream (the
        node failed a read, its adds go on) is closed when that stream ends: never left open for good, which
        a long-lived writer would pay for with a channel per node failure."""
        in_use = set(map(id, self._stream_channels.values()))
        keep = [channel for channel in self._retired if id(channel) in in_use]
        for channel in self._retired:
            if id(channel) not in in_use:
                asyncio.ensure_future(channel.close())
        self._retired = keep

    @property
    def open_channels(self) -> int:
        """Channels not closed yet: cached ones and forgotten ones an add stream still runs on."""
        return len(self._channels) + len(self._retired)

    async def close(self) -> None:
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()
        self._stream_channels.clear()
        for channel in [*self._channels.values(), *self._retired]:
            await channel.close()
        self._channels.clear()
        self._retired.clear()


def _caller_cancelled() -> bool:
    """Whether a CancelledError out of a grpc call is our caller's: its task was asked to stop (a read given
    up, a client closing). Otherwise grpc cancelled the call because its channel was closed under it."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def _cut_off(node: str, method: str) -> NodeError:
    """A call grpc cancelled because _forget closed its channel (another call found the node gone): a node
    failure like any other, so that reads fail over (issue 15: the soak's tailing readers crashed with
    CancelledError, outside the LedgerError hierarchy)."""
    return NodeError(f"node {node}: {method} was cut off: the connection to the node closed")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    if isinstance(exc, asyncio.TimeoutError):
        return "no answer within the deadline"
    return f"{type(exc).__name__}: {exc}"
