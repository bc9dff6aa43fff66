"""A scripted network for protocol races (like BookKeeper's MockBookieClient): in-memory nodes with the
storage rules that matter to the client (fencing, recovery adds, negatives only for what was never
stored), and a script that holds, drops or releases messages in any order. Only for races that real
processes cannot pin down; everything else runs against real nodes."""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Callable

from connector.client.errors import NodeError
from protos import ledger_pb2 as pb


@dataclasses.dataclass
class FakeNode:
    node_id: str
    entries: dict[tuple[int, int], pb.AddEntry] = dataclasses.field(default_factory=dict)
    fenced: set[int] = dataclasses.field(default_factory=set)
    lac: dict[int, int] = dataclasses.field(default_factory=dict)
    frozen: bool = False  # answers nothing, like a SIGSTOPped process
    down: bool = False    # refuses every call at once, like a crashed process
    range_cut: int | None = None  # range reads stop after this entry without their done marker

    def add(self, entry: pb.AddEntry) -> int:
        if entry.ledger_id in self.fenced and not entry.flags & pb.RECOVERY_ADD:
            return pb.FENCED
        self.entries[(entry.ledger_id, entry.entry_id)] = entry
        self.lac[entry.ledger_id] = max(self.lac.get(entry.ledger_id, -1), entry.last_add_confirmed)
        return pb.OK

    def stored(self, ledger_id: int) -> list[int]:
        return sorted(e for (lid, e) in self.entries if lid == ledger_id)


class FakeTransport:
    """Implements connector.client.transport.Transport. Messages are (kind, node, ledger_id, entry_id)."""

    def __init__(self, nodes: list[FakeNode]):
        self.nodes = {n.node_id: n for n in nodes}
        self.sinks: dict[tuple[int, bool], object] = {}
        self.held: list[tuple[str, pb.AddEntry, bool]] = []
        self.sent: list[tuple[str, int, bool]] = []  # (node, entry id, recovery) of every add sent
        self._hold_rules: list[Callable[[str, pb.AddEntry], bool]] = []
        self._fail_rules: list[Callable[[str, pb.AddEntry, bool], bool]] = []

    # -- script ------------------------------------------------------------------------------------------------

    def hold_adds(self, rule: Callable[[str, pb.AddEntry], bool]) -> None:
        """Adds matching rule(node, entry) stay in the network until released."""
        self._hold_rules.append(rule)

    def fail_adds(self, rule: Callable[[str, pb.AddEntry, bool], bool]) -> None:
        """Adds matching rule(node, entry, recovery) are answered with ERROR by the node (a failing disk)."""
        self._fail_rules.append(rule)

    def release(self, order: Callable[[list], list] = list) -> None:
        held, self.held, self._hold_rules = self.held, [], []
        for node, entry, recovery in order(held):
            self._deliver(node, entry, recovery)

    def discard(self) -> None:
        """The held adds are lost in the network; nothing is held from now on."""
        self.held, self._hold_rules = [], []

    def clear_rules(self) -> None:
        self._hold_rules, self._fail_rules = [], []

    def fail_node(self, node: str) -> None:
        """The node's add stream breaks (a crash)."""
        for (_, recovery), sink in list(self.sinks.items()):
            sink.on_node_failure(node, "stream broken (scripted)")

    # -- Transport ---------------------------------------------------------------------------------------------

    def register(self, ledger_id: int, recovery: bool, sink) -> None:
        self.sinks[(ledger_id, recovery)] = sink

    def unregister(self, ledger_id: int, recovery: bool) -> None:
        self.sinks.pop((ledger_id, recovery), None)

    def send_adds(self, node: str, recovery: bool, entries: list[bytes]) -> None:
        for raw in entries:
            (entry,) = pb.AddRequest.FromString(raw).entries
            self.sent.append((node, entry.entry_id, recovery))
            if self.nodes[node].down:
                asyncio.get_running_loop().call_soon(self._broken, node, entry.ledger_id, recovery)
            elif any(rule(node, entry) for rule in self._hold_rules):
                self.held.append((node, entry, recovery))
            else:
                asyncio.get_running_loop().call_soon(self._deliver, node, entry, recovery)

    def _broken(self, node: str, ledger_id: int, recovery: bool) -> None:
        sink = self.sinks.get((ledger_id, recovery))
        if sink is not None:
            sink.on_node_failure(node, "connection refused (scripted crash)")

    def _deliver(self, node: str, entry: pb.AddEntry, recovery: bool) -> None:
        target = self.nodes[node]
        if target.frozen:
            return
        if target.down:
            return self._broken(node, entry.ledger_id, recovery)
        if any(rule(node, entry, recovery) for rule in self._fail_rules):
            status = pb.ERROR
        else:
            status = target.add(entry)
        sink = self.sinks.get((entry.ledger_id, recovery))
        if sink is not None:
            result = pb.AddResult(ledger_id=entry.ledger_id, entry_id=entry.entry_id, status=status)
            asyncio.get_running_loop().call_soon(sink.on_add_result, node, result)

    async def _answer(self, node: str) -> FakeNode:
        target = self.nodes[node]
        if target.frozen:
            await asyncio.Event().wait()  # never answers; the caller's deadline or coverage ends the wait
        await asyncio.sleep(0)
        if target.down:
            raise NodeError(f"node {node} is down (scripted crash)")
        return target

    async def read_lac(self, node: str, request: pb.ReadLacRequest, timeout: float) -> pb.ReadLacResponse:
        target = await self._answer(node)
        if request.fence:
            target.fenced.add(request.ledger_id)
        stored = target.stored(request.ledger_id)
        return pb.ReadLacResponse(status=pb.OK if stored else pb.NO_LEDGER,
                                  last_entry_id=stored[-1] if stored else -1,
                                  last_add_confirmed=target.lac.get(request.ledger_id, -1))

    async def read(self, node: str, request: pb.ReadRequest, timeout: float) -> pb.ReadResponse:
        target = await self._answer(node)
        entry = target.entries.get((request.ledger_id, request.entry_id))
        return response_of(entry) if entry else pb.ReadResponse(status=pb.NO_ENTRY, entry_id=request.entry_id)

    async def read_range(self, node: str, request: pb.ReadRangeRequest, timeout: float):
        target = await self._answer(node)
        if request.fence:
            target.fenced.add(request.ledger_id)
        last = request.last_entry_id if target.range_cut is None else min(request.last_entry_id, target.range_cut)
        entries = [response_of(target.entries[(request.ledger_id, e)])
                   for e in range(request.first_entry_id, last + 1)
                   if (request.ledger_id, e) in target.entries]
        yield pb.ReadRangeResponse(status=pb.OK, entries=entries, done=target.range_cut is None)

    async def write_lac(self, node: str, request: pb.WriteLacRequest, timeout: float) -> pb.WriteLacResponse:
        target = await self._answer(node)
        target.lac[request.ledger_id] = max(target.lac.get(request.ledger_id, -1), request.last_add_confirmed)
        return pb.WriteLacResponse(status=pb.OK)

    async def wait_lac(self, node: str, request: pb.WaitLacRequest, timeout: float) -> pb.ReadLacResponse:
        return await self.read_lac(node, pb.ReadLacRequest(ledger_id=request.ledger_id), timeout)

    async def close(self) -> None:
        pass


def response_of(entry: pb.AddEntry) -> pb.ReadResponse:
    return pb.ReadResponse(status=pb.OK, ledger_id=entry.ledger_id, entry_id=entry.entry_id,
                           last_add_confirmed=entry.last_add_confirmed, payload=entry.payload, digest=entry.digest)
