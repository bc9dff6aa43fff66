"""The simulated network and storage nodes: the fake transport of the race tests, on a virtual clock, with
faults drawn from the schedule's random generator.

Nodes keep the storage rules that matter to the client (tests/harness/fake_transport.FakeNode: fencing,
recovery adds, negatives only for what was never stored); everything they store survives a crash. A
node can be down (calls are refused, add streams break: a crashed process), frozen (requests wait and are
served when it thaws: SIGSTOP), or up. Messages take a random delay; some are held for seconds, some
replies are lost, add streams are reset (in-flight adds may still land, their results are lost), and a
range read may end early without its done marker or break half-way.
"""
from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Callable

from connector.client.errors import NodeError
from protos import ledger_pb2 as pb
from tests.harness.fake_transport import FakeNode, response_of

RANGE_MESSAGE_ENTRIES = 4


@dataclasses.dataclass
class Faults:
    """How hostile the network is: drawn per schedule (some calm, some hostile: swarm testing); all zero
    once the schedule heals the network."""

    slow: float = 0.0          # a message held for 0.2-3 s
    lost_reply: float = 0.0    # a unary reply that never arrives (the caller's deadline ends the wait)
    reset: float = 0.0         # an add stream reset when adds are sent on it
    range_cut: float = 0.0     # a range read that ends early without its done marker
    range_break: float = 0.0   # a range read that breaks half-way

    @classmethod
    def draw(cls, rng: random.Random) -> "Faults":
        return cls(rng.uniform(0, 0.3), rng.uniform(0, 0.05), rng.uniform(0, 0.03), rng.uniform(0, 0.05),
                   rng.uniform(0, 0.05))


class SimNode(FakeNode):
    def __init__(self, node_id: str):
        super().__init__(node_id)
        self.backlog: list[Callable[[], None]] = []  # requests that reached a frozen node

    def read_lac(self, request: pb.ReadLacRequest) -> pb.ReadLacResponse:
        if request.fence:
            self.fenced.add(request.ledger_id)
        stored = self.stored(request.ledger_id)
        known = stored or request.ledger_id in self.fenced
        return pb.ReadLacResponse(status=pb.OK if known else pb.NO_LEDGER,
                                  last_entry_id=stored[-1] if stored else -1,
                                  last_add_confirmed=self.lac.get(request.ledger_id, -1))

    def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        entry = self.entries.get((request.ledger_id, request.entry_id))
        if entry is not None:
            return response_of(entry)
        status = pb.NO_ENTRY if self.stored(request.ledger_id) else pb.NO_LEDGER
        return pb.ReadResponse(status=status, ledger_id=request.ledger_id, entry_id=request.entry_id)

    def read_range(self, request: pb.ReadRangeRequest) -> list[pb.ReadRangeResponse]:
        if request.fence:
            self.fenced.add(request.ledger_id)
        if not self.stored(request.ledger_id):
            return [pb.ReadRangeResponse(status=pb.NO_LEDGER, done=True)]
        found = [response_of(self.entries[(request.ledger_id, e)])
                 for e in range(request.first_entry_id, request.last_entry_id + 1)
                 if (request.ledger_id, e) in self.entries]
        messages = [pb.ReadRangeResponse(status=pb.OK, entries=found[i:i + RANGE_MESSAGE_ENTRIES])
                    for i in range(0, len(found), RANGE_MESSAGE_ENTRIES)] or [pb.ReadRangeResponse(status=pb.OK)]
        messages[-1].done = True
        return messages


class SimNetwork:
    def __init__(self, rng: random.Random, node_ids: list[str], trace: Callable[[str], None]):
        self.rng = rng
        self.nodes = {n: SimNode(n) for n in node_ids}
        self.faults = Faults.draw(rng)
        self.trace = trace
        self.transports: list[SimTransport] = []

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    def delay(self) -> float:
        if self.rng.random() < self.faults.slow:
            return self.rng.uniform(0.2, 3.0)
        return self.rng.uniform(0.0005, 0.02)

    # -- nemesis -------------------------------------------------------------------------------------------------

    def crash(self, node: str) -> None:
        self.trace(f"node {node} crashes")
        self.nodes[node].down = True
        self.nodes[node].backlog.clear()  # what a frozen node had not read yet dies with it
        for transport in self.transports:
            transport.connection_lost(node, "connection reset: node crashed (simulated)")

    def restart(self, node: str) -> None:
        self.trace(f"node {node} restarts")
        self.nodes[node].down = False

    def freeze(self, node: str) -> None:
        self.trace(f"node {node} freezes")
        self.nodes[node].frozen = True

    def thaw(self, node: str) -> None:
        self.trace(f"node {node} thaws")
        target = self.nodes[node]
        target.frozen = False
        backlog, target.backlog = target.backlog, []
        for request in backlog:
            request()

    def heal(self) -> None:
        self.faults = Faults()
        for node_id, node in self.nodes.items():
            if node.down:
                self.restart(node_id)
            if node.frozen:
                self.thaw(node_id)

    # -- delivery ------------------------------------------------------------------------------------------------

    def at_node(self, node: str, serve: Callable[[SimNode], None], refused: Callable[[], None]) -> None:
        """serve runs when the request reaches an up node (later, for a frozen one); refused if it is down."""
        target = self.nodes[node]

        def arrive() -> None:
            if target.down:
                refused()
            elif target.frozen:
                target.backlog.append(arrive)
            else:
                serve(target)
        self.loop.call_later(self.delay(), arrive)


class SimTransport:
    """One client's connections (implements connector.client.transport.Transport)."""

    def __init__(self, network: SimNetwork, name: str):
        self.network = network
        self.name = name
        self.sinks: dict[bool, dict[int, object]] = {False: {}, True: {}}
        self._generation: dict[tuple[str, bool], int] = {}
        self._next_arrival: dict[tuple[str, bool], float] = {}
        network.transports.append(self)

    # -- adds ----------------------------------------------------------------------------------------------------

    def register(self, ledger_id: int, recovery: bool, sink) -> None:
        self.sinks[recovery][ledger_id] = sink

    def unregister(self, ledger_id: int, recovery: bool) -> None:
        self.sinks[recovery].pop(ledger_id, None)

    def send_adds(self, node: str, recovery: bool, entries: list[bytes]) -> None:
        net, lane = self.network, (node, recovery)
        generation = self._generation.setdefault(lane, 0)
        loop = net.loop
        for raw in entries:
            (entry,) = pb.AddRequest.FromString(raw).entries
            # One stream per node and lane: adds arrive in the order sent.
            arrival = max(self._next_arrival.get(lane, 0.0), loop.time() + net.delay())
            self._next_arrival[lane] = arrival
            loop.call_at(arrival, self._add_arrives, node, recovery, generation, entry)
        if net.rng.random() < net.faults.reset:
            loop.call_later(net.rng.uniform(0.0, 0.05), self._reset, node, recovery, "stream reset (simulated)")

    def _add_arrives(self, node: str, recovery: bool, generation: int, entry: pb.AddEntry) -> None:
        target = self.network.nodes[node]
        if generation != self._generation[(node, recovery)] and self.network.rng.random() < 0.5:
            return  # lost with its reset stream (the other half landed before the reset)
        if target.down:
            self._reset(node, recovery, "connection refused (simulated crash)")
        elif target.frozen:
            target.backlog.append(lambda: self._add_arrives(node, recovery, generation, entry))
        else:
            status = target.add(entry)
            result = pb.AddResult(ledger_id=entry.ledger_id, entry_id=entry.entry_id, status=status)
            self.network.loop.call_later(self.network.delay(), self._add_result, node, recovery, generation, result)

    def _add_result(self, node: str, recovery: bool, generation: int, result: pb.AddResult) -> None:
        if generation != self._generation[(node, recovery)]:
            return
        sink = self.sinks[recovery].get(result.ledger_id)
        if sink is not None:
            sink.on_add_result(node, result)

    def _reset(self, node: str, recovery: bool, reason: str) -> None:
        lane = (node, recovery)
        self._generation[lane] = self._generation.get(lane, 0) + 1
        self._next_arrival.pop(lane, None)
        for sink in list(self.sinks[recovery].values()):
            sink.on_node_failure(node, reason)

    def connection_lost(self, node: str, reason: str) -> None:
        for recovery in (False, True):
            if (node, recovery) in self._generation:
                self._reset(node, recovery, reason)

    # -- unary calls and range reads -----------------------------------------------------------------------------

    async def _call(self, node: str, serve: Callable[[SimNode], object], timeout: float):
        net = self.network
        answer = net.loop.create_future()

        def reply(value: object) -> None:
            if not answer.done():
                answer.set_result(value)

        def served(target: SimNode) -> None:
            if answer.done() and net.rng.random() < 0.5:
                return  # the caller gave up (deadline) before a frozen node read the call: cancelled there
            value = serve(target)  # the node acts (fences, stores) whether or not the reply arrives
            if net.rng.random() >= net.faults.lost_reply:
                net.loop.call_later(net.delay(), reply, value)

        def refused() -> None:
            net.loop.call_later(net.delay(), reply, NodeError(f"node {node}: connection refused (simulated)"))

        net.at_node(node, served, refused)
        try:
            value = await asyncio.wait_for(answer, timeout)
        except asyncio.TimeoutError:
            raise NodeError(f"node {node}: deadline exceeded (simulated)") from None
        if isinstance(value, NodeError):
            raise value
        return value

    async def read_lac(self, node: str, request: pb.ReadLacRequest, timeout: float) -> pb.ReadLacResponse:
        return await self._call(node, lambda n: n.read_lac(request), timeout)

    async def read(self, node: str, request: pb.ReadRequest, timeout: float) -> pb.ReadResponse:
        return await self._call(node, lambda n: n.read(request), timeout)

    async def read_range(self, node: str, request: pb.ReadRangeRequest, timeout: float):
        messages = await self._call(node, lambda n: n.read_range(request), timeout)
        rng, faults = self.network.rng, self.network.faults
        draw = rng.random()
        if draw < faults.range_cut + faults.range_break:
            cut = rng.randrange(len(messages))
            for message in messages[:cut] + [_partial(messages[cut], rng)]:
                message.done = False
                yield message
            if draw < faults.range_cut:
                return  # ended without its done marker: a broken peer
            raise NodeError(f"node {node}: ReadRange broke (simulated)")
        for message in messages:
            # Each message after its own network delay: what a node sends meanwhile (a write-back's acks, say) may
            # arrive between two messages of one range, as on a real network; one later than the deadline ends the
            # range as the real transport's per-message deadline does.
            delay = self.network.delay() if message is not messages[0] else 0.0
            await asyncio.sleep(min(delay, timeout))
            if delay > timeout:
                raise NodeError(f"node {node}: deadline exceeded mid-range (simulated)")
            yield message

    async def write_lac(self, node: str, request: pb.WriteLacRequest, timeout: float) -> pb.WriteLacResponse:
        def serve(target: SimNode) -> pb.WriteLacResponse:
            target.lac[request.ledger_id] = max(target.lac.get(request.ledger_id, -1), request.last_add_confirmed)
            return pb.WriteLacResponse(status=pb.OK)
        return await self._call(node, serve, timeout)

    async def wait_lac(self, node: str, request: pb.WaitLacRequest, timeout: float) -> pb.ReadLacResponse:
        return await self.read_lac(node, pb.ReadLacRequest(ledger_id=request.ledger_id), timeout)

    async def close(self) -> None:
        pass


def _partial(original: pb.ReadRangeResponse, rng: random.Random) -> pb.ReadRangeResponse:
    """A copy of the message with only its first few entries: where the stream broke."""
    message = pb.ReadRangeResponse()
    message.CopyFrom(original)
    del message.entries[rng.randint(0, len(message.entries)):]
    return message
