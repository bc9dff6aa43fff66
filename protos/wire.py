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

from protos import ledger_pb2 as pb

_ENTRIES_TAG = bytes([(pb.AddRequest.ENTRIES_FIELD_NUMBER << 3) | 2])  # length-delimited
_PAYLOAD_TAG = bytes([(pb.AddEntry.PAYLOAD_FIELD_NUMBER << 3) | 2])
_RANGE_ENTRIES_TAG = bytes([(pb.ReadRangeResponse.ENTRIES_FIELD_NUMBER << 3) | 2])
_READ_PAYLOAD_TAG = bytes([(pb.ReadResponse.PAYLOAD_FIELD_NUMBER << 3) | 2])
RANGE_RESULTS = pb.AddRequest(range_results=True).SerializeToString()


def add_request(ledger_id: int, entry_id: int, master_key: bytes, flags: int, last_add_confirmed: int,
                digest: int, payload: bytes) -> bytes:
    head = pb.AddEntry(ledger_id=ledger_id, entry_id=entry_id, master_key=master_key, flags=flags,
                       last_add_confirmed=last_add_confirmed, digest=digest).SerializeToString()
    return b"".join(_frame(_ENTRIES_TAG, head, _PAYLOAD_TAG, payload))


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
    """Protobuf base-128 varint of a non-negative int."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
