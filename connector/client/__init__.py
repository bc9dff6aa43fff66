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
from connector.client.api import LedgerClient, ReadHandle, WriteHandle, default_metadata_uri
from connector.client.errors import (
    DigestMismatchError,
    EntryRefusedError,
    EntryTooLargeError,
    LedgerClosedError,
    LedgerError,
    LedgerFencedError,
    MetadataConflictError,
    NoSuchLedgerError,
    NotEnoughNodesError,
    RecoveryIncompleteError,
    UnauthorizedError,
)
from connector.client.ops.read import Entry
from connector.client.retry import Retry
from connector.client.security import SecurityConfigError, TlsConfig
from connector.client.stream_reader import StreamEntry
from connector.client.stream_writer import StreamWriter
from connector.client.streams import Streams

__all__ = [
    "LedgerClient", "TlsConfig", "SecurityConfigError", "WriteHandle", "ReadHandle", "Entry", "Retry",
    "default_metadata_uri", "Streams", "StreamWriter", "StreamEntry",
    "LedgerError", "LedgerFencedError", "LedgerClosedError", "NoSuchLedgerError", "UnauthorizedError",
    "EntryTooLargeError", "EntryRefusedError",
    "NotEnoughNodesError", "RecoveryIncompleteError", "MetadataConflictError", "DigestMismatchError",
]
