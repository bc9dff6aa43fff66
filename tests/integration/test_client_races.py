"""Protocol races pinned down with a scripted network (tests/harness/fake_transport.py) and the real
metadata store: the writer's late add arriving after recovery closed the ledger, an acknowledged entry
missing from one node, and rule 3's resend only to the replacement."""
import asyncio

import pytest

from connector.client import LedgerFencedError, RecoveryIncompleteError
from connector.client.runner import AddPipeline, Context, recover
from metadata import registry
from metadata.errors import MetadataError
from metadata.model import Fragment, LedgerMetadata, LedgerState, NodeRegistration
from protos import ledger_pb2 as pb
from protos.digest import master_key, password_hash
from tests.harness.fake_transport import FakeNode, FakeTransport, response_of

KEY = master_key(b"")


def setup(store, node_ids, ensemble, quorums=(3, 3, 2)):
    registrations = [registry.register_node(store, NodeRegistration(n, "fake:0")) for n in node_ids]
    e, wq, aq = quorums
    current = store.create_ledger(LedgerMetadata(0, e, wq, aq, (Fragment(0, tuple(ensemble)),),
                                                 password_hash=password_hash(b"")))
    transport = FakeTransport([FakeNode(n) for n in node_ids])
    return current, transport, Context(store, transport, timeout=1.0, add_timeout=30.0), registrations


async def until(condition, what, deadline=10.0):
    give_up = asyncio.get_running_loop().time() + deadline
    while asyncio.get_running_loop().time() < give_up:
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never happened: {what}")


async def append_all(writer, payloads):
    return [await asyncio.wrap_future(writer.append_async(p)) for p in payloads]


def test_late_add_reaching_the_nodes_after_recovery_closed_is_fenced_and_not_in_the_ledger(store):
    current, transport, ctx, _ = setup(store, ["a", "b", "c"], ["a", "b", "c"])

    async def scenario():
        writer = AddPipeline(ctx, current, KEY)
        assert await append_all(writer, [b"e%d" % i for i in range(5)]) == [0, 1, 2, 3, 4]
        transport.hold_adds(lambda node, entry: entry.entry_id == 5)  # in the network, not yet at any node
        late = writer.append_async(b"late")
        await until(lambda: len(transport.held) == 3, "entry 5 sent to the three nodes")
        closed = await recover(ctx, store.read_ledger(current.value.ledger_id), KEY)
        transport.release()
        with pytest.raises(LedgerFencedError):
            await asyncio.wrap_future(late)
        writer.stop()
        return closed

    closed = asyncio.run(scenario())
    assert (closed.value.state, closed.value.last_entry_id) == (LedgerState.CLOSED, 4)
    assert all(node.stored(current.value.ledger_id) == [0, 1, 2, 3, 4] for node in transport.nodes.values())


def test_entry_acknowledged_by_two_nodes_but_missing_on_the_third_is_recovered(store):
    current, transport, ctx, _ = setup(store, ["a", "b", "c"], ["a", "b", "c"])

    async def scenario():
        writer = AddPipeline(ctx, current, KEY)
        await append_all(writer, [b"e0", b"e1"])
        transport.hold_adds(lambda node, entry: node == "c" and entry.entry_id == 2)
        assert await append_all(writer, [b"e2"]) == [2]  # acknowledged by a and b
        closed = await recover(ctx, store.read_ledger(current.value.ledger_id), KEY)
        transport.release()  # c is fenced now: the late copy is refused
        await until(lambda: not transport.held, "the late add delivered")
        # recover() returns once AQ nodes took the write-back: c's copy may land a moment later
        await until(lambda: transport.nodes["c"].stored(current.value.ledger_id) == [0, 1, 2],
                    "the write-back's copy on c")
        with pytest.raises(LedgerFencedError):
            await asyncio.wrap_future(writer.append_async(b"e3"))
        writer.stop()
        return closed

    closed = asyncio.run(scenario())
    assert closed.value.last_entry_id == 2
    # the write-back put entry 2 on c too (a recovery add is accepted on a fenced ledger)
    assert transport.nodes["c"].stored(current.value.ledger_id) == [0, 1, 2]
    assert ("c", 2, True) in transport.sent


def test_ensemble_change_resends_only_unconfirmed_entries_and_only_to_the_replacement(store):
    current, transport, ctx, _ = setup(store, ["a", "b", "c", "d"], ["a", "b", "c"])

    async def scenario():
        writer = AddPipeline(ctx, current, KEY)
        await append_all(writer, [b"e0", b"e1", b"e2"])
        transport.hold_adds(lambda node, entry: node in ("b", "c") and entry.entry_id >= 3)
        pending = [writer.append_async(b"e3"), writer.append_async(b"e4")]
        await until(lambda: len(transport.held) == 4, "entries 3 and 4 held for b and c")
        sent_before = len(transport.sent)
        transport.fail_node("c")
        ids = [await asyncio.wrap_future(f) for f in pending]  # a + the replacement d make AQ
        writer.stop()
        return ids, transport.sent[sent_before:]

    ids, resent = asyncio.run(scenario())
    assert ids == [3, 4]
    assert sorted(resent) == [("d", 3, False), ("d", 4, False)]
    meta = store.read_ledger(current.value.ledger_id).value
    assert meta.fragments == (Fragment(0, ("a", "b", "c")), Fragment(3, ("a", "b", "d")))


def test_a_recovery_that_died_after_its_write_back_changed_the_ensemble_does_not_let_the_next_truncate(store):
    """Issue 12 finding 1 (rule 12): R1's write-back replaces b; R1 dies before closing; a crashes; R2 must
    still find entry 5 (acknowledged by a and b) and close at 5, not at 4."""
    current, transport, ctx, _ = setup(store, ["a", "b", "c", "d"], ["a", "b", "c"])
    ledger_id = current.value.ledger_id

    async def scenario():
        writer = AddPipeline(ctx, current, KEY)
        await append_all(writer, [b"e%d" % i for i in range(5)])
        transport.hold_adds(lambda node, entry: node == "c" and entry.entry_id == 5)
        assert await append_all(writer, [b"e5"]) == [5]  # acknowledged by a and b; c never gets it
        writer.stop()  # the writer dies
        transport.discard()
        transport.fail_adds(lambda node, entry, recovery: recovery and node == "b")
        transport.hold_adds(lambda node, entry: node in ("c", "d"))  # slow c; d's copy is lost with R1
        first = asyncio.ensure_future(recover(ctx, store.read_ledger(ledger_id), KEY))
        await until(lambda: ("d", 5, True) in transport.sent, "R1 replaced b by d and resent entry 5 to d")
        first.cancel()  # R1 dies
        await asyncio.gather(first, return_exceptions=True)
        transport.discard()
        transport.clear_rules()
        transport.nodes["a"].down = True  # node a crashes
        return await recover(ctx, store.read_ledger(ledger_id), KEY)

    closed = asyncio.run(scenario())
    assert (closed.value.state, closed.value.last_entry_id) == (LedgerState.CLOSED, 5)
    holders = [n for n, node in transport.nodes.items() if 5 in node.stored(ledger_id)]
    assert len(set(holders) & set(closed.value.ensemble_for(5))) >= 2


def test_a_recovery_read_that_ends_without_its_done_marker_leaves_entries_unknown(store):
    """Issue 12 finding 5 (rule 11): a range that ended early is no proof that the entries are absent."""
    current, transport, ctx, _ = setup(store, ["a", "b", "c"], ["a", "b", "c"])
    ledger_id = current.value.ledger_id

    async def scenario():
        writer = AddPipeline(ctx, current, KEY)
        await append_all(writer, [b"e%d" % i for i in range(5)])
        transport.hold_adds(lambda node, entry: node == "c" and entry.entry_id == 5)
        assert await append_all(writer, [b"e5"]) == [5]  # on a and b only
        writer.stop()
        transport.discard()
        transport.nodes["a"].range_cut = 4   # a's stream ends after entry 4, without done
        transport.nodes["b"].down = True
        with pytest.raises(RecoveryIncompleteError):
            await recover(ctx, store.read_ledger(ledger_id), KEY)
        assert not store.read_ledger(ledger_id).value.is_closed
        transport.nodes["a"].range_cut = None
        transport.nodes["b"].down = False
        return await recover(ctx, store.read_ledger(ledger_id), KEY)

    closed = asyncio.run(scenario())
    assert closed.value.last_entry_id == 5


class _Unreachable(FakeTransport):
    """One client's view of the shared nodes: those in `cut` never answer it."""

    def __init__(self, nodes, cut):
        super().__init__(list(nodes))
        self.cut = set(cut)

    async def _answer(self, node):
        if node in self.cut:
            await asyncio.Event().wait()
        return await super()._answer(node)


class _Trickling(FakeTransport):
    """A recovery's view: `source` sends its range one entry per message, each once the previous one is written back
    to the others (big entries); it holds `held_from` on until `go` is set. The others answer once it has sent the
    window holding its entries whole."""

    def __init__(self, nodes, source, held_from, go):
        super().__init__(list(nodes))
        self.source, self.held_from, self.go = source, held_from, go
        self.source_done = asyncio.Event()

    async def read_range(self, node, request, timeout):
        target = await self._answer(node)
        if request.fence:
            target.fenced.add(request.ledger_id)
        if node != self.source:
            await self.source_done.wait()
            async for response in super().read_range(node, request, timeout):
                yield response
            return
        others = [n for n in self.nodes.values() if n is not target]
        if (request.ledger_id, request.first_entry_id) not in target.entries:
            yield pb.ReadRangeResponse(status=pb.OK, done=True)   # a later window: nothing there
            return
        for entry_id in range(request.first_entry_id, request.last_entry_id + 1):
            entry = target.entries.get((request.ledger_id, entry_id))
            if entry is None:
                break
            if entry_id >= self.held_from:
                await self.go.wait()
            yield pb.ReadRangeResponse(status=pb.OK, entries=[response_of(entry)])
            await until(lambda: all((request.ledger_id, entry_id) in n.entries for n in others if not n.down),
                        f"entry {entry_id} written back")
        self.source_done.set()
        yield pb.ReadRangeResponse(status=pb.OK, done=True)


def test_concurrent_recoveries_leave_no_node_a_lac_past_the_end_they_close_at(store):
    """Helper audit 2026-11-29 finding 1 (rules 12, 17): R2 writes back entries only c holds, one at a time; R1,
    which cannot reach c, closes the ledger at the last one R2 wrote back before it read. R2's later write-backs
    carried the LAC of its own write-back (up to 7), so the nodes held a LAC past the end (6): a tailing reader read
    entry 7, which the closed ledger does not hold, and a stream would hand its offsets out again."""
    current, transport, ctx, _ = setup(store, ["a", "b", "c"], ["a", "b", "c"])
    ledger_id = current.value.ledger_id
    nodes = list(transport.nodes.values())

    async def scenario():
        writer = AddPipeline(ctx, current, KEY)
        await append_all(writer, [b"e%d" % i for i in range(5)])
        transport.hold_adds(lambda node, entry: node in ("a", "b"))
        for i in range(5, 9):
            writer.append_async(b"e%d" % i)   # 5..8 reach c only: none is acknowledged; the writer dies
        await until(lambda: transport.nodes["c"].stored(ledger_id) == list(range(9)), "entries 5..8 on c")
        writer.stop()
        transport.discard()
        r1_done = asyncio.Event()
        r2_ctx = Context(store, _Trickling(nodes, "c", 7, r1_done), timeout=5.0, add_timeout=30.0)
        r2 = asyncio.ensure_future(recover(r2_ctx, store.read_ledger(ledger_id), KEY))
        await until(lambda: all((ledger_id, 6) in node.entries for node in nodes), "R2 wrote 5 and 6 back")
        r1_ctx = Context(store, _Unreachable(nodes, "c"), timeout=1.0, add_timeout=30.0)
        first_close = await recover(r1_ctx, store.read_ledger(ledger_id), KEY)
        r1_done.set()
        second_close = await r2
        return first_close, second_close

    first_close, second_close = asyncio.run(scenario())
    assert first_close.value.last_entry_id == second_close.value.last_entry_id == 6
    assert {node.node_id: node.lac[ledger_id] for node in nodes if node.lac[ledger_id] > 6} == {}
    assert all(8 in node.stored(ledger_id) for node in nodes)   # R2 wrote 7 and 8 back, after R1's close


def test_a_recovery_read_window_that_fails_with_any_error_counts_unknown_instead_of_waiting_forever(store):
    """Writer/recovery audit 2026-11-29: a window whose read raised something other than a node error (the
    transport's address lookup raised a metadata error) died without its answer; the recovery waited for it
    forever. Its node's answer is now unknown: the attempt stops, as rule 11 says, and a retry closes."""
    current, transport, ctx, _ = setup(store, ["a", "b", "c"], ["a", "b", "c"])
    ledger_id = current.value.ledger_id
    real_read_range = transport.read_range

    def read_range(node, request, timeout):
        if node == "c" and request.fence:
            raise MetadataError("ZooKeeper unreachable while listing the nodes (scripted)")
        return real_read_range(node, request, timeout)

    async def scenario():
        writer = AddPipeline(ctx, current, KEY)
        await append_all(writer, [b"e%d" % i for i in range(3)])
        writer.stop()
        transport.nodes["b"].down = True            # b: unknown; c: its window fails with another error
        transport.read_range = read_range
        with pytest.raises(RecoveryIncompleteError):
            await asyncio.wait_for(recover(ctx, store.read_ledger(ledger_id), KEY), 30)
        transport.nodes["b"].down = False
        transport.read_range = real_read_range
        return await recover(ctx, store.read_ledger(ledger_id), KEY)

    closed = asyncio.run(scenario())
    assert (closed.value.state, closed.value.last_entry_id) == (LedgerState.CLOSED, 2)
