"""The grpc.aio server: the StorageNode service with parse-safe deserializers, plus the health service."""
from __future__ import annotations

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2_grpc

from protos import ledger_pb2 as pb
from storage_node.add_request import parse_add_request
from storage_node.config import NodeConfig
from storage_node.errors import StorageNodeError
from storage_node.security import TokenCheck, read_token, server_credentials
from storage_node.service import SERVICE_NAME, Malformed, StorageNodeService


def _parser(message_type, decode=None):
    """Unparseable bytes become Malformed, so the service answers BAD_REQUEST instead of gRPC failing."""
    decode = decode or message_type.FromString

    def parse(data: bytes):
        try:
            return decode(data)
        except DecodeError as exc:
            return Malformed(f"malformed {message_type.__name__}: {exc}")
    return parse


def _handlers(service: StorageNodeService) -> grpc.GenericRpcHandler:
    def unary(method, request_type):
        return grpc.unary_unary_rpc_method_handler(
            method, request_deserializer=_parser(request_type), response_serializer=_serialize,
        )

    return grpc.method_handlers_generic_handler(SERVICE_NAME, {
        "Add": grpc.stream_stream_rpc_method_handler(
            service.Add, request_deserializer=_parser(pb.AddRequest, parse_add_request),
            response_serializer=_serialize,
        ),
        "Read": unary(service.Read, pb.ReadRequest),
        "ReadRange": grpc.unary_stream_rpc_method_handler(
            service.ReadRange, request_deserializer=_parser(pb.ReadRangeRequest), response_serializer=_serialize,
        ),
        "ReadLac": unary(service.ReadLac, pb.ReadLacRequest),
        "WriteLac": unary(service.WriteLac, pb.WriteLacRequest),
        "WaitLac": unary(service.WaitLac, pb.WaitLacRequest),
        "NodeInfo": unary(service.NodeInfo, pb.NodeInfoRequest),
    })


def _serialize(message) -> bytes:
    """Messages the service already encoded (ReadRange batches, see protos/wire.py) go out as they are."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def create_server(config: NodeConfig, service: StorageNodeService) -> tuple[grpc.aio.Server, int]:
    """Bind (port 0 picks a free port) without starting; returns the server and its port.

    TLS (--tls-cert/--tls-key, mutual with --tls-ca) replaces the plain-text port; it is one or the other.
    """
    credentials = server_credentials(config)
    token = read_token(config)
    server = grpc.aio.server(
        interceptors=[TokenCheck(token)] if token is not None else None,
        maximum_concurrent_rpcs=config.max_concurrent_rpcs,     # then RESOURCE_EXHAUSTED: memory stays bounded
        options=[
            ("grpc.max_receive_message_length", config.max_request_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),
        ],
    )
    server.add_generic_rpc_handlers((_handlers(service),))
    health_pb2_grpc.add_HealthServicer_to_server(service.health, server)
    address = f"{config.host}:{config.port}"
    try:
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        raise StorageNodeError(
            f"cannot listen on {config.address} ({exc}): another process uses the port; choose another --port"
        ) from exc
    if port == 0:
        raise StorageNodeError(f"cannot listen on {config.address}: choose another --port or --host")
    return server, port
