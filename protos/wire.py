"""Wire bytes of the messages that carry payloads, built with one copy of each payload.

`add_request(...)` returns one entry framed as a complete one-entry AddRequest. Protobuf merges repeated
fields of concatenated messages, so joining such frames gives the AddRequest of all of them, and a frame
sent on its own needs no join at all. The payload is appended as its own field after the small header that
protobuf serializes (fields may come in any order on the wire), so building a frame copies the payload
exactly once, however many nodes it goes to: for 1 MiB entries those copies are most of a writer's CPU.

Appending `RANGE_RESULTS` to joined frames asks the node to answer the request's entries in ranges
(AddResponse.ranges) rather than one AddResult each.

`read_range_entry(...)` does the same for an entry of a ReadRangeResponse on the node: the parts of the
frame, the payload a view into the record read from the journal, copied once when the message is joined.
"""
from __future__ import annotations

import struct

from protos import ledger_pb2 as pb

_ENTRIES_TAG = bytes([(pb.AddRequest.ENTRIES_FIELD_NUMBER << 3) | 2])  # length-delimited
_ENTRY_ID_TAG = bytes([pb.AddEntry.ENTRY_ID_FIELD_NUMBER << 3])          # varint
_LAC_TAG = bytes([pb.AddEntry.LAST_ADD_CONFIRMED_FIELD_NUMBER << 3])
_DIGEST_TAG = bytes([(pb.AddEntry.DIGEST_FIELD_NUMBER << 3) | 5])       # fixed32
_pack_digest = struct.Struct("<I").pack
_prefixes: dict[tuple, bytes] = {}      # (ledger id, master key, flags) -> those fields serialized
_MAX_PREFIXES = 1024
_PAYLOAD_TAG = bytes([(pb.AddEntry.PAYLOAD_FIELD_NUMBER << 3) | 2])
_RANGE_ENTRIES_TAG = bytes([(pb.ReadRangeResponse.ENTRIES_FIELD_NUMBER << 3) | 2])
_READ_PAYLOAD_TAG = bytes([(pb.ReadResponse.PAYLOAD_FIELD_NUMBER << 3) | 2])
RANGE_RESULTS = pb.AddRequest(range_results=True).SerializeToString()


def add_request(ledger_id: int, entry_id: int, master_key: bytes, flags: int, last_add_confirmed: int,
                digest: int, payload: bytes) -> bytes:
    """A writer frames every entry it sends, so this is written out by hand: the fields that stay the same
    for a ledger's writer (ledger id, key, flags) are serialized once (protobuf's own encoder) and reused,
    the entry's own ones are appended after them (fields may come in any order), zeros omitted as proto3
    does. tests/unit/test_wire.py checks that protobuf decodes it to exactly what was put in."""
    fixed = (ledger_id, master_key, flags)
    prefix = _prefixes.get(fixed)
    if prefix is None:
        if len(_prefixes) >= _MAX_PREFIXES:
            _prefixes.clear()
        prefix = _prefixes[fixed] = pb.AddEntry(ledger_id=ledger_id, master_key=master_key,
                                                flags=flags).SerializeToString()
    entry = varint(entry_id)
    lac = varint(last_add_confirmed)
    size = len(payload)
    payload_size = varint(size) if size else b""
    # prefix, entry id, LAC, digest (5 bytes with its tag), payload with its tag and size
    length = len(prefix) + 1 + len(entry) + 1 + len(lac) + 5 + (1 + len(payload_size) if size else 0) + size
    return b"".join((_ENTRIES_TAG, varint(length), prefix, _ENTRY_ID_TAG, entry, _LAC_TAG, lac, _DIGEST_TAG,
                     _pack_digest(digest), _PAYLOAD_TAG if size else b"", payload_size, payload))


def read_range_entry(status: int, message: str, ledger_id: int, entry_id: int, last_add_confirmed: int,
                     digest: int, payload) -> tuple:
    """The parts of one `entries` field of a ReadRangeResponse (payload: bytes or a memoryview), to be
    joined after a serialized ReadRangeResponse head and before its tail."""
    head = pb.ReadResponse(status=status, message=message, ledger_id=ledger_id, entry_id=entry_id,
                           last_add_confirmed=last_add_confirmed, digest=digest).SerializeToString()
    return _frame(_RANGE_ENTRIES_TAG, head, _READ_PAYLOAD_TAG, payload)


def _frame(field_tag: bytes, head: bytes, payload_tag: bytes, payload) -> tuple:
    """A length-delimited field holding `head` (a serialized message without its payload) and the payload."""
    size = len(payload)
    payload_head = payload_tag + varint(size) if size else b""
    return field_tag + varint(len(head) + len(payload_head) + size) + head + payload_head, payload


def varint(value: int) -> bytes:
    """Protobuf base-128 varint of an int64 (a negative one is its two's complement: ten bytes)."""
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    if 0 < value < 0x4000:                  # the common sizes and ids, without the loop
        return bytes((value & 0x7F | 0x80, value >> 7))
    if 0 < value < 0x200000:
        return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14))
    if value == -1:
        return _MINUS_ONE
    value &= _U64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_U64 = (1 << 64) - 1
_ONE_BYTE = [bytes([value]) for value in range(0x80)]
_MINUS_ONE = b"\xff" * 9 + b"\x01"
