"""How the client proves itself to storage nodes and checks that it talks to real ones.

TlsConfig: mutual TLS. The client verifies each node's certificate against `ca` and the address it dials
(a node registered as 127.0.0.1:PORT needs an IP subjectAltName 127.0.0.1), and presents `cert`/`key` to nodes
that require client certificates (--tls-ca on the node). The token is sent as call metadata to nodes started
with --auth-token-file. Both default to the environment, like the metadata URI:

    LEDGER_TLS_CA, LEDGER_TLS_CERT, LEDGER_TLS_KEY   PEM files (CA bundle, client certificate, its key)
    LEDGER_AUTH_TOKEN_FILE                           a file holding the shared token
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import TYPE_CHECKING

from metadata.errors import LedgerError
from protos.auth import TOKEN_METADATA_KEY
from protos.pem import CERTIFICATE, PRIVATE_KEY, missing_pem

if TYPE_CHECKING:
    import grpc

TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV = "LEDGER_TLS_CA", "LEDGER_TLS_CERT", "LEDGER_TLS_KEY"
AUTH_TOKEN_FILE_ENV = "LEDGER_AUTH_TOKEN_FILE"


class SecurityConfigError(LedgerError):
    """TLS or token settings that cannot work: a missing file, a certificate without its key, ..."""


@dataclasses.dataclass(frozen=True)
class TlsConfig:
    """Paths of PEM files: ca verifies the nodes; cert and key (together) identify this client."""

    ca: str
    cert: str | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        if not self.ca:
            raise SecurityConfigError("TLS needs a CA bundle (ca / --tls-ca / tlsCa) to verify the storage nodes")
        if (self.cert is None) != (self.key is None):
            raise SecurityConfigError("a client certificate (cert / --tls-cert / tlsCert) and its key "
                                      "(key / --tls-key / tlsKey) go together")

    @classmethod
    def from_paths(cls, ca: str | None, cert: str | None = None, key: str | None = None) -> "TlsConfig | None":
        """None when nothing is given (plain text); an error when only a client certificate or key is, or when a
        file cannot be read or is not PEM of its kind (checked now, as the options are parsed)."""
        if not (ca or cert or key):
            return None
        if not ca:
            raise SecurityConfigError("a client certificate without a CA bundle: give the CA that signed the "
                                      "storage nodes' certificates (--tls-ca / tlsCa / $LEDGER_TLS_CA)")
        config = cls(ca, cert or None, key or None)
        config.pem_files()
        return config

    @classmethod
    def from_env(cls) -> "TlsConfig | None":
        env = os.environ.get
        return cls.from_paths(env(TLS_CA_ENV), env(TLS_CERT_ENV), env(TLS_KEY_ENV))

    def pem_files(self) -> tuple[bytes, bytes | None, bytes | None]:
        """The CA bundle, client key and client certificate as read now (SecurityConfigError if one cannot be, or
        holds no PEM block of its kind)."""
        return (_read_pem(self.ca, "CA bundle", CERTIFICATE, "tlsCa / --tls-ca / $LEDGER_TLS_CA"),
                _read_pem(self.key, "client key", PRIVATE_KEY, "tlsKey / --tls-key / $LEDGER_TLS_KEY") if self.key
                else None,
                _read_pem(self.cert, "client certificate", CERTIFICATE, "tlsCert / --tls-cert / $LEDGER_TLS_CERT")
                if self.cert else None)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        import grpc  # here, not above: a client that never calls a node does not load gRPC (api.LedgerClient)

        ca, key, cert = self.pem_files()
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def read_token_file(path: str | os.PathLike) -> str:
    token = _read(path, "auth token file").strip()
    if not token or not token.isascii():
        raise SecurityConfigError(f"auth token file {path} must hold a non-empty ASCII token")
    return token.decode()


def token_from_env() -> str | None:
    path = os.environ.get(AUTH_TOKEN_FILE_ENV)
    return read_token_file(path) if path else None


def call_metadata(token: str | None) -> tuple[tuple[str, str], ...] | None:
    return ((TOKEN_METADATA_KEY, token),) if token else None


def _read_pem(path: str, what: str, kind: str, names: str) -> bytes:
    data = _read(path, what)
    lacking = missing_pem(data, kind)
    if lacking:
        raise SecurityConfigError(f"{what} {path} holds {lacking}; {names} takes a PEM file")
    return data


def _read(path: str | os.PathLike, what: str) -> bytes:
    try:
        return pathlib.Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise SecurityConfigError(f"cannot read the {what} {path}: {exc.strerror}; every process that opens "
                                  "a client (Spark executors too) must see the same path") from exc
