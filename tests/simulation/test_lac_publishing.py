"""Rules 2 and 17 on the simulator's virtual clock (tests/simulation/clock.py), with the scripted in-memory nodes
of tests/harness/fake_transport.py: an idle writer publishes its LAC IDLE_LAC_AFTER after its last append,
whatever the rate of its appends; a writer that appends more often sends no explicit LAC (each add carries
it); a stopped one sends none."""
import asyncio

from connector.client.runner import AddPipeline, Context
from connector.client.runner.add import IDLE_LAC_AFTER
from metadata.model import Fragment, LedgerMetadata
from protos import ledger_pb2 as pb
from protos.digest import master_key, password_hash
from tests.harness.fake_transport import FakeNode, FakeTransport
from tests.simulation.clock import VirtualClockLoop
from tests.simulation.metadata import InMemoryStore

NODES = ("a", "b", "c")


class CountingTransport(FakeTransport):
    def __init__(self):
        super().__init__([FakeNode(n) for n in NODES])
        self.explicit: list[tuple[float, str, int]] = []   # (virtual time, node, LAC) of each explicit LAC

    async def write_lac(self, node: str, request: pb.WriteLacRequest, timeout: float) -> pb.WriteLacResponse:
        self.explicit.append((asyncio.get_running_loop().time(), node, request.last_add_confirmed))
        return await super().write_lac(node, request, timeout)


def run(scenario):
    """scenario(pipeline, transport) on a virtual clock; returns the transport."""
    async def main():
        store = InMemoryStore(trace=lambda _line: None)
        current = store.create_ledger(LedgerMetadata(0, 3, 3, 2, (Fragment(0, NODES),),
                                                     password_hash=password_hash(b"")))
        transport = CountingTransport()
        pipeline = AddPipeline(Context(store, transport, timeout=1.0, add_timeout=30.0), current, master_key(b""))
        try:
            await scenario(pipeline, transport)
        finally:
            pipeline.stop()
        return transport

    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def node_lacs(transport: FakeTransport) -> list[int]:
    return [transport.nodes[n].lac.get(0, -1) for n in NODES]


def test_a_sparse_writers_lac_reaches_every_node_idle_lac_after_each_append():
    seen: list[tuple[int, list[int], list[int]]] = []

    async def scenario(pipeline, transport):
        for entry_id in range(5):
            assert await asyncio.wrap_future(pipeline.append_async(b"sparse")) == entry_id
            appended = pipeline.loop.time()
            await asyncio.sleep(IDLE_LAC_AFTER / 2)
            before = node_lacs(transport)                       # the entry's own add carried the LAC before it
            await asyncio.sleep(appended + IDLE_LAC_AFTER * 1.2 - pipeline.loop.time())
            seen.append((entry_id, before, node_lacs(transport)))
            await asyncio.sleep(1.0)                            # one append a second

    transport = run(scenario)
    assert seen == [(e, [e - 1] * 3, [e] * 3) for e in range(5)]
    assert sorted((node, lac) for _, node, lac in transport.explicit) == sorted((n, e) for n in NODES for e in range(5))


def test_a_writer_that_appends_more_often_than_idle_lac_after_sends_no_explicit_lac_until_it_stops():
    async def scenario(pipeline, transport):
        for entry_id in range(40):
            pipeline.append_async(b"steady")
            await asyncio.sleep(IDLE_LAC_AFTER / 2)
        stopped = pipeline.loop.time()
        assert transport.explicit == []
        await asyncio.sleep(IDLE_LAC_AFTER * 1.2)
        assert node_lacs(transport) == [39] * 3
        sent = [(lac, round(at - stopped, 6) <= IDLE_LAC_AFTER) for at, _, lac in transport.explicit]
        assert sent == [(39, True)] * 3

    run(scenario)


def test_a_stopped_writer_sends_no_explicit_lac():
    """A close stops the pipeline right after its last add completes: the armed timer goes with it."""
    async def scenario(pipeline, transport):
        assert await asyncio.wrap_future(pipeline.append_async(b"last")) == 0
        pipeline.stop()
        await asyncio.sleep(IDLE_LAC_AFTER * 10)
        assert transport.explicit == [] and node_lacs(transport) == [-1] * 3

    run(scenario)
