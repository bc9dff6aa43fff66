"""The entry digest: CRC32C over ledger id, entry id, piggybacked LAC and payload.

Computed by the writer, checked by the storage node on add and by every reader, so a flipped bit
anywhere between the writer's memory and the reader's is caught (DESIGN section 3).
"""
from __future__ import annotations

import struct

import crc32c

_HEADER = struct.Struct(">qqq")


def entry_digest(ledger_id: int, entry_id: int, last_add_confirmed: int, payload: bytes) -> int:
    header = _HEADER.pack(ledger_id, entry_id, last_add_confirmed)
    return crc32c.crc32c(payload, crc32c.crc32c(header))
