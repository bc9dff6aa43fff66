"""The LedgerClient a command opens: its --metadata URI, the storage node security options, and a short wait
for ZooKeeper, so that an unreachable one is a single line after about a second (issue 16)."""
from __future__ import annotations

from connector.client import LedgerClient
from connector.commands import node_security

CONNECT_TIMEOUT = 2.0  # seconds to reach ZooKeeper before a command gives up with one line saying so


def open_client(args, **settings) -> LedgerClient:
    """settings: more LedgerClient settings of the command's (max_entry_bytes, say)."""
    return LedgerClient(args.metadata, connect_timeout=CONNECT_TIMEOUT, **node_security.client_options(args),
                        **settings)
