"""Who may talk to the node: TLS server credentials (mutual with --tls-ca) and the shared call token.

Both are checked once per call or stream (the TLS handshake per connection, the token per call), never per
entry, so the add path costs nothing more once a stream is open. The health service stays open: it tells
nothing about the data and load balancers probe it without credentials.
"""
from __future__ import annotations

import hmac
import pathlib

import grpc

from protos.auth import TOKEN_METADATA_KEY
from storage_node.config import NodeConfig
from storage_node.errors import ConfigError

_OPEN_PREFIX = "/grpc.health.v1.Health/"


def _read(path: pathlib.Path, flag: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {flag} {path}: {exc.strerror}") from exc


def server_credentials(config: NodeConfig) -> grpc.ServerCredentials | None:
    """None when the node serves plain text (no --tls-cert)."""
    if config.tls_cert is None:
        return None
    pair = (_read(config.tls_key, "--tls-key"), _read(config.tls_cert, "--tls-cert"))
    ca = _read(config.tls_ca, "--tls-ca") if config.tls_ca is not None else None
    try:
        return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=ca is not None)
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(f"--tls-cert/--tls-key/--tls-ca are not usable PEM files: {exc}") from exc


def read_token(config: NodeConfig) -> bytes | None:
    if config.auth_token_file is None:
        return None
    token = _read(config.auth_token_file, "--auth-token-file").strip()
    if not token or not token.isascii():
        raise ConfigError(f"--auth-token-file {config.auth_token_file} must hold a non-empty ASCII token")
    return token


class TokenCheck(grpc.aio.ServerInterceptor):
    """Refuse, with UNAUTHENTICATED, every call that does not carry the node's token."""

    def __init__(self, token: bytes):
        self._token = token

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        if handler is None or details.method.startswith(_OPEN_PREFIX):
            return handler
        presented = next((value for key, value in details.invocation_metadata or ()
                          if key == TOKEN_METADATA_KEY), None)
        if isinstance(presented, str) and hmac.compare_digest(presented.encode(), self._token):
            return handler
        why = "no auth token" if presented is None else "a wrong auth token"
        return _refusal(handler, f"call {details.method} carries {why}: this node requires the cluster's token "
                                 "(client: auth_token / --auth-token-file / $LEDGER_AUTH_TOKEN_FILE)")


def _refusal(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape that aborts before reading anything (request bytes are not even parsed)."""
    async def refuse(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)
