"""The entry digest: CRC32C over ledger id, entry id, piggybacked LAC and payload.

Computed by the writer, checked by the storage node on add and by every reader, so a flipped bit
anywhere between the writer's memory and the reader's is caught (DESIGN section 3).
"""
from __future__ import annotations

import hashlib
import struct

import crc32c

_HEADER = struct.Struct(">qqq")


def entry_digest(ledger_id: int, entry_id: int, last_add_confirmed: int, payload: bytes) -> int:
    header = _HEADER.pack(ledger_id, entry_id, last_add_confirmed)
    return crc32c.crc32c(payload, crc32c.crc32c(header))


def master_key(password: bytes) -> bytes:
    """The key a storage node stores per ledger (rule 7), derived from the ledger password."""
    return hashlib.sha256(b"ledger-master-key:" + bytes(password)).digest()


def password_hash(password: bytes) -> str:
    """What ledger metadata records, so a client can reject a wrong password before touching nodes."""
    return hashlib.sha256(master_key(password)).hexdigest()
