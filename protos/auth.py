"""The call metadata that carries the shared token of storage nodes started with --auth-token-file."""
from __future__ import annotations

TOKEN_METADATA_KEY = "x-ledger-token"  # gRPC metadata keys are lower-case ASCII
