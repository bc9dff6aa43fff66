"""AddRequest wire bytes built once per entry and shared by every node of the write set.

`add_request(...)` returns one entry framed as a complete one-entry AddRequest. Protobuf merges repeated
fields of concatenated messages, so joining such frames gives the AddRequest of all of them, and a frame
sent on its own needs no join at all. The payload is appended as its own field after the small header that
protobuf serializes (fields may come in any order on the wire), so building a frame copies the payload
exactly once, however many nodes it goes to: for 1 MiB entries those copies are most of a writer's CPU.
"""
from __future__ import annotations

from protos import ledger_pb2 as pb

_ENTRIES_TAG = bytes([(pb.AddRequest.ENTRIES_FIELD_NUMBER << 3) | 2])  # length-delimited
_PAYLOAD_TAG = bytes([(pb.AddEntry.PAYLOAD_FIELD_NUMBER << 3) | 2])


def add_request(ledger_id: int, entry_id: int, master_key: bytes, flags: int, last_add_confirmed: int,
                digest: int, payload: bytes) -> bytes:
    head = pb.AddEntry(ledger_id=ledger_id, entry_id=entry_id, master_key=master_key, flags=flags,
                       last_add_confirmed=last_add_confirmed, digest=digest).SerializeToString()
    payload_head = _PAYLOAD_TAG + varint(len(payload)) if payload else b""
    body_length = len(head) + len(payload_head) + len(payload)
    return b"".join((_ENTRIES_TAG, varint(body_length), head, payload_head, payload))


def varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
