"""The client's transport never leaves a channel open for good (cost over time: a long-lived writer).

When a call to a node fails UNAVAILABLE the transport forgets the node: the next call opens a new channel.
A forgotten channel that still carries an add stream (the node failed a read while its adds went on) used to
be dropped without being closed, so each such failure left one channel, and its socket, open for the life
of the process. Now it is closed as soon as no add stream runs on it. Real nodes, the real transport,
observed (a subclass that records the channels it opens), never replaced.
"""
from __future__ import annotations

from connector.client import LedgerClient
from connector.client.ops.read import RangeCall
from connector.client.runner import read_range
from connector.client.runner.read import RangeEnd
from connector.client.transport import GrpcTransport
from metadata import registry
from protos import ledger_pb2 as pb
from tests.harness.poll import poll_until

FORGETS = 5


class _RecordingTransport(GrpcTransport):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.opened: dict[str, list] = {}

    def _channel(self, node):
        channel = super()._channel(node)
        seen = self.opened.setdefault(node, [])
        if not any(c is channel for c in seen):
            seen.append(channel)
        return channel


class _RecordingClient(LedgerClient):
    def transport(self) -> GrpcTransport:
        return _RecordingTransport(self.store, self.tls, self.auth_token, self.node_addresses)


def closed(channel) -> bool:
    return channel._channel.closed()


def test_forgotten_channels_are_closed_once_no_add_stream_runs_on_them(cluster, metadata_uri):
    nodes = {n.node_id: n for n in cluster(4)}
    with _RecordingClient(metadata_uri) as lc:
        transport: _RecordingTransport = lc._ctx.transport
        writer = lc.create_ledger(3, 3, 2)
        for i in range(20):
            writer.append(f"before {i}".encode())
        node = writer.metadata.fragments[-1].ensemble[0]
        request = pb.ReadLacRequest(ledger_id=writer.ledger_id)

        async def forget_then_read():   # on the client's loop, where _unary forgets a node it found UNAVAILABLE
            transport._forget(node)
            await transport.read_lac(node, request, 10.0)

        for _ in range(FORGETS):   # the node failed a read each time, its adds went on
            lc._runtime.run(forget_then_read())
        for i in range(20):
            writer.append(f"after {i}".encode())
        stream_channel, *read_channels = transport.opened[node]
        assert len(read_channels) == FORGETS
        # the add stream still runs on the first channel; the ones only reads used are closed but the newest
        poll_until(lambda: all(closed(c) for c in read_channels[:-1]), timeout=10,
                   what="the forgotten channels no stream runs on to be closed")
        assert not closed(stream_channel) and not closed(read_channels[-1])

        nodes[node].kill()   # its add stream breaks: the writer replaces the node, the stream's channel closes
        for i in range(20):
            writer.append(f"without {i}".encode())
        poll_until(lambda: closed(stream_channel), timeout=30, what="the broken stream's channel to be closed")
        assert node not in writer.metadata.fragments[-1].ensemble
        writer.close()


def test_a_node_that_restarted_at_another_address_is_dialled_where_it_registers_now(cluster, metadata_uri, store):
    """The transport lists every node's address when it first dials one. It used to dial a node it had not used
    yet at the address listed then, so a node that had since restarted elsewhere (a new port, a new host) failed
    its first call: a read that fails over, an ensemble change for a writer."""
    nodes = {n.node_id: n for n in cluster(4)}
    with LedgerClient(metadata_uri) as lc:
        transport = lc._ctx.transport
        writer = lc.create_ledger(3, 3, 2)
        writer.append(b"listed")
        spare = next(n for n in nodes if n not in writer.metadata.fragments[-1].ensemble)
        listed = transport._addresses[spare]
        node = nodes[spare]
        node.stop()
        node.port = 0                           # it comes back at another port
        node.start()
        assert node.address != listed
        poll_until(lambda: getattr(registry.list_nodes(store).get(spare), "address", None) == node.address, 30,
                   what=f"{spare} to register its new address")
        answer = lc._runtime.run(transport.read_lac(spare, pb.ReadLacRequest(ledger_id=writer.ledger_id), 10.0))
        assert answer.status == pb.NO_LEDGER
        writer.close()


def test_a_range_read_that_finds_its_node_unavailable_dials_where_the_node_registers_next(cluster, metadata_uri, store):
    """A failed ReadRange never made the transport forget the node (unary calls did), so a long-lived reader whose
    chunks went to a node restarted elsewhere kept dialling its old address (audit 2026-11-29, finding 3)."""
    nodes = {n.node_id: n for n in cluster(3)}
    with LedgerClient(metadata_uri) as lc:
        writer = lc.create_ledger(3, 3, 2)
        writer.append_many([b"entry-%d" % i for i in range(20)])
        meta = writer.close()
    # a reader only: no add stream breaks when the node stops (a broken stream makes the transport forget it)
    with LedgerClient(metadata_uri) as lc:
        assert len(list(lc.open_ledger(meta.ledger_id).read())) == 20   # the reader has channels to the nodes
        restarted = meta.last_fragment.ensemble[0]
        node, listed = nodes[restarted], nodes[restarted].address
        node.stop()
        node.port = 0                           # it comes back at another port
        node.start()
        assert node.address != listed
        poll_until(lambda: getattr(registry.list_nodes(store).get(restarted), "address", None) == node.address, 30,
                   what=f"{restarted} to register its new address")

        def range_read() -> tuple[RangeEnd, list[int]]:
            got: list[int] = []
            call = RangeCall(restarted, 0, 19)
            end = lc._runtime.run(read_range(lc._ctx, meta.ledger_id, call, lambda _, e: got.append(e.entry_id)))
            return end, got

        first, _ = range_read()
        assert not first.complete and "UNAVAILABLE" in first.reason   # the old address
        second, got = range_read()
        assert second.complete and got == list(range(20))
