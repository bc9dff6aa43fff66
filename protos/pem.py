"""What a TLS PEM file must hold, checked alike by the client (connector/client/security.py) and the storage node
(storage_node/config.py): they never import each other (DESIGN section 2). A file without a PEM block of its kind
is refused when the options are read, naming the block it lacks, not left to gRPC, which takes it silently or
fails later at a handshake."""
from __future__ import annotations

import re

CERTIFICATE = "certificate"
PRIVATE_KEY = "private key"
_BEGIN = {
    CERTIFICATE: (re.compile(rb"-----BEGIN CERTIFICATE-----"), "-----BEGIN CERTIFICATE-----"),
    PRIVATE_KEY: (re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----"), "-----BEGIN PRIVATE KEY-----"),
}


def missing_pem(data: bytes, kind: str) -> str | None:
    """None if data holds a PEM block of kind (CERTIFICATE or PRIVATE_KEY), else what it lacks, for a message:
    "no PEM certificate (-----BEGIN CERTIFICATE-----)"."""
    pattern, shown = _BEGIN[kind]
    return None if pattern.search(data) else f"no PEM {kind} ({shown})"
