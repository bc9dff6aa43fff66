"""Decoding AddRequest wire bytes without copying large payloads.

The generic protobuf decoder copies each payload twice (into its arena, then out into a bytes object), and
for 1 MiB entries those copies cost the node more CPU than writing the entry to its journal. parse_in_place
yields each payload as a memoryview of the received message, which the journal writes as it is. It is Python
(the field reader of protos/wire.py), so it costs more per field than the generic decoder: parse_add_request
uses it only when the first entry is large (the client sends an entry of 1 MiB or more in a message of its
own), and the generic decoder for batches of small entries.

It follows the protobuf encoding rules for proto3 (ledger.proto): fields in any order, the last value of a
repeated scalar field wins, unknown fields are skipped, negative int64 take ten bytes, uint32 fields keep
the low 32 bits. Anything else (a truncated varint or field, a wrong wire type for a known field, groups,
field number 0) raises DecodeError, as the generic decoder would. tests/unit/test_add_request.py checks
both decoders agree on valid and damaged input.
"""
from __future__ import annotations

import dataclasses

from google.protobuf.message import DecodeError

from protos import ledger_pb2 as pb
from protos.wire import FIXED32, LENGTH, VARINT, fields, int64, read_varint

LARGE_ENTRY_BYTES = 64 * 1024
_FIRST_ENTRY_TAG = (pb.AddRequest.ENTRIES_FIELD_NUMBER << 3) | LENGTH


@dataclasses.dataclass(slots=True)
class AddEntry:
    """The fields of ledger.proto's AddEntry; payload is a view of the request bytes."""

    ledger_id: int = 0
    entry_id: int = 0
    master_key: bytes = b""
    flags: int = 0
    last_add_confirmed: int = 0
    payload: memoryview | bytes = b""
    digest: int = 0


@dataclasses.dataclass(slots=True)
class AddRequest:
    entries: list[AddEntry]
    range_results: bool = False


def parse_add_request(data: bytes) -> AddRequest | pb.AddRequest:
    """The request, decoded in place when its first entry is LARGE_ENTRY_BYTES or more."""
    if len(data) >= LARGE_ENTRY_BYTES and data[0] == _FIRST_ENTRY_TAG:
        try:
            first_length, _ = read_varint(data, 1, min(len(data), 11))
        except DecodeError:
            first_length = 0
        if first_length >= LARGE_ENTRY_BYTES:
            return parse_in_place(data)
    return pb.AddRequest.FromString(data)


def parse_in_place(data: bytes) -> AddRequest:
    view = memoryview(data)
    request = AddRequest([])
    for number, wire_type, value in fields(view, 0, len(view)):
        if number == 1:
            if wire_type != LENGTH:
                raise DecodeError(f"AddRequest.entries has wire type {wire_type}, expected length-delimited")
            request.entries.append(_entry(view, *value))
        elif number == 2:
            if wire_type != VARINT:
                raise DecodeError(f"AddRequest.range_results has wire type {wire_type}, expected varint")
            request.range_results = value != 0
    return request


def _entry(view: memoryview, start: int, end: int) -> AddEntry:
    entry = AddEntry()
    for number, wire_type, value in fields(view, start, end):
        if number in (1, 2, 5):
            _expect(number, wire_type, VARINT)
            value = int64(value)
            if number == 1:
                entry.ledger_id = value
            elif number == 2:
                entry.entry_id = value
            else:
                entry.last_add_confirmed = value
        elif number == 4:
            _expect(number, wire_type, VARINT)
            entry.flags = value & 0xFFFFFFFF
        elif number in (3, 6):
            _expect(number, wire_type, LENGTH)
            if number == 3:
                entry.master_key = bytes(view[value[0]:value[1]])
            else:
                entry.payload = view[value[0]:value[1]]
        elif number == 7:
            _expect(number, wire_type, FIXED32)
            entry.digest = value
    return entry


def _expect(number: int, wire_type: int, expected: int) -> None:
    if wire_type != expected:
        raise DecodeError(f"AddEntry field {number} has wire type {wire_type}, expected {expected}")
