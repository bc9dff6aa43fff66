"""Certificates for the security tests: the cluster's CA with a node and a client certificate, and a second,
unrelated CA whose certificates nobody should accept."""
from __future__ import annotations

import dataclasses
import pathlib

import pytest

from connector.certificates import CertificateAuthority, Issued
from connector.client import TlsConfig


@dataclasses.dataclass(frozen=True)
class Pki:
    ca: CertificateAuthority
    node: Issued
    client: Issued
    other_ca: CertificateAuthority
    other_client: Issued        # signed by other_ca
    other_node: Issued          # signed by other_ca, naming 127.0.0.1
    misnamed_node: Issued       # signed by ca, but naming another host

    def node_args(self, node: Issued | None = None, require_client_cert: bool = True) -> tuple[str, ...]:
        node = node or self.node
        args = ("--tls-cert", str(node.cert), "--tls-key", str(node.key))
        return args + (("--tls-ca", str(self.ca.cert)) if require_client_cert else ())

    def client_tls(self, client: Issued | None = None, ca: CertificateAuthority | None = None) -> TlsConfig:
        client = client or self.client
        return TlsConfig(ca=str((ca or self.ca).cert), cert=str(client.cert), key=str(client.key))


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Pki:
    root: pathlib.Path = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority.create(root / "ca")
    other = CertificateAuthority.create(root / "other", name="an unrelated CA")
    return Pki(
        ca=ca,
        node=ca.issue(root / "ca", "node"),
        client=ca.issue(root / "ca", "client", hosts=(), client=True),
        other_ca=other,
        other_client=other.issue(root / "other", "client", hosts=(), client=True),
        other_node=other.issue(root / "other", "node"),
        misnamed_node=ca.issue(root / "ca", "misnamed-node", hosts=("node.example.invalid",)),
    )
