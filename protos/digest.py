"""The entry digest: CRC32C over ledger id, entry id, piggybacked LAC and payload.

Computed by the writer, checked by the storage node on add and by every reader, so a flipped bit
anywhere between the writer's memory and the reader's is caught (DESIGN section 3).
"""
from __future__ import annotations

import hashlib
import struct
from typing import Callable

_HEADER = struct.Struct(">qqq")
# crc32c.crc32c, imported on the first digest: the package looks up its own version in the installed packages'
# metadata as it is imported (about 40 ms in a Spark Python worker), which a process that only hashes passwords
# (Spark's driver-side steps) need not pay.
_crc32c: Callable[..., int] | None = None


def entry_digest(ledger_id: int, entry_id: int, last_add_confirmed: int, payload: bytes) -> int:
    crc = _crc32c or _load_crc32c()
    return crc(payload, crc(_HEADER.pack(ledger_id, entry_id, last_add_confirmed)))


def _load_crc32c() -> Callable[..., int]:
    global _crc32c
    from crc32c import crc32c

    _crc32c = crc32c
    return crc32c


def master_key(password: bytes) -> bytes:
    """The key a storage node stores per ledger (rule 7), derived from the ledger password."""
    return hashlib.sha256(b"ledger-master-key:" + bytes(password)).digest()


def password_hash(password: bytes) -> str:
    """What ledger metadata records, so a client can reject a wrong password before touching nodes (and a storage
    node a wrong master key at a ledger's first sight: key_hash)."""
    return key_hash(master_key(password))


def key_hash(key: bytes) -> str:
    """The password hash in ledger metadata of a ledger whose master key is key."""
    return hashlib.sha256(bytes(key)).hexdigest()
