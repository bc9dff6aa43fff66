"""The client's ReadRange decoder (protos.wire.read_range_message) over real gRPC: a message that does not decode
fails the call with NodeError naming the node (the reader then tries another replica), instead of reaching the
reader as None. A real gRPC server on loopback sends the bytes; the real transport receives them."""
from __future__ import annotations

import asyncio

import grpc
import pytest

from connector.client.errors import NodeError
from connector.client.transport import GrpcTransport
from protos import ledger_pb2 as pb
from protos import wire

BIG = bytes(wire.VIEW_MIN_BYTES)
WHOLE = pb.ReadRangeResponse(status=pb.OK, entries=[pb.ReadResponse(entry_id=0, payload=BIG)]).SerializeToString()


class _Transport(GrpcTransport):
    """The real transport, its node's address given (no registry to look it up in)."""

    def __init__(self, address: str):
        super().__init__(store=None)
        self._address = address

    def _lookup(self, node: str) -> str:
        return self._address


async def _read_from_server_sending(messages: list[bytes]) -> list:
    async def read_range(request, context):
        for message in messages:
            yield message

    handler = grpc.method_handlers_generic_handler("ledger.v1.StorageNode", {
        "ReadRange": grpc.unary_stream_rpc_method_handler(
            read_range, request_deserializer=pb.ReadRangeRequest.FromString, response_serializer=lambda b: b)})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    transport = _Transport(f"127.0.0.1:{port}")
    try:
        request = pb.ReadRangeRequest(ledger_id=1, first_entry_id=0, last_entry_id=0)
        return [m async for m in transport.read_range("n1", request, 5.0)]
    finally:
        await transport.close()
        await server.stop(None)


def test_a_message_that_decodes_arrives_with_its_payload_as_a_view():
    message, = asyncio.run(_read_from_server_sending([WHOLE]))
    assert isinstance(message, wire.ReadRangeResponseView) and message.status == pb.OK
    assert bytes(message.entries[0].payload) == BIG and isinstance(message.entries[0].payload, memoryview)


@pytest.mark.parametrize("cut", [1, 7, len(WHOLE) - 1])
def test_a_message_that_does_not_decode_fails_the_call_naming_the_node(cut):
    with pytest.raises(NodeError, match="node n1: ReadRange sent a message that does not decode"):
        asyncio.run(_read_from_server_sending([WHOLE, WHOLE[:cut]]))
