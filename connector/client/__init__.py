"""The ledger client: striped quorum writes, ensemble changes, fencing and safe recovery (DESIGN section 4).

    from connector.client import LedgerClient, Streams
    with LedgerClient("zk://127.0.0.1:2181/ledgers") as lc:
        with lc.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2) as w:
            w.append(b"event")
        for entry in lc.open_ledger(w.ledger_id).read(0, 0):
            ...
        with Streams(lc).open_writer("events") as sw:    # streams: a layer above ledgers (streams.py)
            sw.append(b"event")
"""
import importlib
from typing import TYPE_CHECKING

# Exported names and the module each lives in, imported on first use (PEP 562): a process that needs only the
# metadata side (Spark's driver-side steps: planning, committing) or one submodule (errors, placement) does not
# pay for gRPC, asyncio, crc32c and prometheus_client, about 0.2 CPU s in each new Spark Python worker.
_EXPORTS = {
    "LedgerClient": "api", "ReadHandle": "api", "WriteHandle": "api", "default_metadata_uri": "api",
    "ClientClosedError": "errors", "DigestMismatchError": "errors", "EntryRefusedError": "errors",
    "EntryTooLargeError": "errors", "LedgerClosedError": "errors", "LedgerError": "errors",
    "LedgerFencedError": "errors", "MetadataConflictError": "errors", "NoSuchLedgerError": "errors",
    "NotEnoughNodesError": "errors", "RecoveryIncompleteError": "errors", "UnauthorizedError": "errors",
    "Entry": "ops.read", "Retry": "retry", "SecurityConfigError": "security", "TlsConfig": "security",
    "StreamEntry": "stream_reader", "StreamWriter": "stream_writer", "Streams": "streams",
}

if TYPE_CHECKING:
    from connector.client.api import LedgerClient, ReadHandle, WriteHandle, default_metadata_uri
    from connector.client.errors import (
        ClientClosedError, DigestMismatchError, EntryRefusedError, EntryTooLargeError, LedgerClosedError, LedgerError,
        LedgerFencedError, MetadataConflictError, NoSuchLedgerError, NotEnoughNodesError, RecoveryIncompleteError,
        UnauthorizedError,
    )
    from connector.client.ops.read import Entry
    from connector.client.retry import Retry
    from connector.client.security import SecurityConfigError, TlsConfig
    from connector.client.stream_reader import StreamEntry
    from connector.client.stream_writer import StreamWriter
    from connector.client.streams import Streams


if not TYPE_CHECKING:  # type checkers see the imports above and flag a name that is not exported
    def __getattr__(name: str):
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(_EXPORTS))


__all__ = list(_EXPORTS)
