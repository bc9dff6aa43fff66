"""The options every command that talks to storage nodes shares: TLS files and the node token.

Each defaults to its environment variable (read by connector.client.security), so one `export` serves every
command, the demo and applications alike. ZooKeeper credentials travel in --metadata
(zk://user:secret@host:port/root) or $LEDGER_ZK_AUTH.
"""
from __future__ import annotations

import argparse

from connector.client.security import TlsConfig, read_token_file
from connector.commands.arguments import non_empty


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("storage node security (each defaults to its environment variable)")
    # An empty one would mean "not given" and the environment's file (or plain text) would silently be used.
    group.add_argument("--tls-ca", type=non_empty,
                       help="PEM CA bundle that signed the nodes' certificates ($LEDGER_TLS_CA)")
    group.add_argument("--tls-cert", type=non_empty,
                       help="PEM client certificate for nodes that require one ($LEDGER_TLS_CERT)")
    group.add_argument("--tls-key", type=non_empty, help="PEM key of --tls-cert ($LEDGER_TLS_KEY)")
    group.add_argument("--auth-token-file", type=non_empty,
                       help="file with the nodes' shared token ($LEDGER_AUTH_TOKEN_FILE)")


def client_options(args: argparse.Namespace) -> dict:
    """LedgerClient keyword arguments; what is not given falls back to the environment inside the client."""
    return {
        "tls": TlsConfig.from_paths(args.tls_ca, args.tls_cert, args.tls_key),
        "auth_token": read_token_file(args.auth_token_file) if args.auth_token_file else None,
    }
