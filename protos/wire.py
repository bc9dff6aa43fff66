"""Wire bytes of the messages that carry payloads, built with one copy of each payload.

`add_requests(...)` frames each of a batch of entries as a complete one-entry AddRequest (`add_request(...)`
one entry). Protobuf merges repeated fields of concatenated messages, so joining such frames gives the
AddRequest of all of them, and a frame sent on its own needs no join at all. The payload is appended as its own
field after the small header that protobuf serializes (fields may come in any order on the wire), so building a
frame copies the payload exactly once, however many nodes it goes to: for 1 MiB entries those copies are most of
a writer's CPU.

Appending `RANGE_RESULTS` to joined frames asks the node to answer the request's entries in ranges
(AddResponse.ranges) rather than one AddResult each.

`read_range_entry(...)` does the same for an entry of a ReadRangeResponse on the node: the parts of the
frame, the payload a view into the record read from the journal, copied once when the message is joined.

`read_range_message(...)` is the client's side of it: a received ReadRangeResponse of big entries decoded with
each payload a view into the message (ReadRangeResponseView, ReadResponseView), not a copy.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

from google.protobuf.message import DecodeError

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


class AddFields(NamedTuple):
    """An entry's own fields in its AddRequest frame (what add_requests reads from each add)."""

    entry_id: int
    last_add_confirmed: int
    digest: int
    payload: bytes


def add_request(ledger_id: int, entry_id: int, master_key: bytes, flags: int, last_add_confirmed: int,
                digest: int, payload: bytes) -> bytes:
    """One entry's frame: add_requests of one."""
    return add_requests(ledger_id, master_key, flags, (AddFields(entry_id, last_add_confirmed, digest, payload),))[0]


def _prefix(ledger_id: int, master_key: bytes, flags: int) -> bytes:
    """The fields a ledger's writer sends the same in every entry, serialized once (protobuf's own encoder)."""
    fixed = (ledger_id, master_key, flags)
    prefix = _prefixes.get(fixed)
    if prefix is None:
        if len(_prefixes) >= _MAX_PREFIXES:
            _prefixes.clear()
        prefix = _prefixes[fixed] = pb.AddEntry(ledger_id=ledger_id, master_key=master_key,
                                                flags=flags).SerializeToString()
    return prefix


def add_requests(ledger_id: int, master_key: bytes, flags: int, adds) -> list[bytes]:
    """The frame of each of `adds` (objects with AddFields' attributes: a writer's PendingAdds), as a one-entry
    AddRequest. A writer frames every entry it sends, so this is written out by hand: the fields that stay the
    same for a ledger's writer (ledger id, key, flags) are serialized once (protobuf's own encoder) and reused,
    the entry's own ones are appended after them (fields may come in any order), the payload last; a LAC or
    payload size equal to the previous entry's is not encoded again. tests/unit/test_wire.py checks that
    protobuf decodes the frames to exactly what was put in."""
    prefix = _prefix(ledger_id, master_key, flags)
    pack_digest, join = _pack_digest, b"".join
    frames = []
    lac = size = None
    for add in adds:
        if add.last_add_confirmed != lac:
            lac = add.last_add_confirmed
            lac_bytes = varint(lac)
            size = None
        payload = add.payload
        if len(payload) != size:
            size = len(payload)
            size_head = _PAYLOAD_TAG + varint(size) if size else b""
            # all of the entry's fields but its id: prefix, three tags, LAC, the 4-byte digest, payload
            rest = len(prefix) + 3 + len(lac_bytes) + 4 + len(size_head) + size
        entry = varint(add.entry_id)
        frames.append(join((_ENTRIES_TAG, varint(rest + len(entry)), prefix, _ENTRY_ID_TAG, entry, _LAC_TAG,
                            lac_bytes, _DIGEST_TAG, pack_digest(add.digest), size_head, payload)))
    return frames


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


# -- decoding a ReadRangeResponse: payloads as views into the received message -------------------------------------

VIEW_MIN_BYTES = 16 * 1024   # a message whose first entry is smaller is decoded by protobuf itself
_U32 = struct.Struct("<I")
_INT64_SIGN = 1 << 63
_RANGE = pb.ReadRangeResponse
_READ = pb.ReadResponse
_READ_VARINTS = {_READ.STATUS_FIELD_NUMBER: "status", _READ.LEDGER_ID_FIELD_NUMBER: "ledger_id",
                 _READ.ENTRY_ID_FIELD_NUMBER: "entry_id", _READ.LAST_ADD_CONFIRMED_FIELD_NUMBER: "last_add_confirmed"}


class ReadResponseView:
    """A ReadResponse of a ReadRangeResponse, decoded with its payload a read-only memoryview into the message
    (what pb.ReadResponse has, attribute for attribute; its defaults those of proto3)."""

    __slots__ = ("status", "message", "ledger_id", "entry_id", "last_add_confirmed", "payload", "digest")

    def __init__(self) -> None:
        self.status = 0
        self.message = ""
        self.ledger_id = self.entry_id = self.last_add_confirmed = self.digest = 0
        self.payload: memoryview | bytes = b""


class ReadRangeResponseView:
    """A decoded ReadRangeResponse whose entries are ReadResponseView (what pb.ReadRangeResponse has)."""

    __slots__ = ("status", "message", "entries", "done")

    def __init__(self) -> None:
        self.status = 0
        self.message = ""
        self.entries: list[ReadResponseView] = []
        self.done = False


def read_range_message(data: bytes) -> ReadRangeResponseView | pb.ReadRangeResponse:
    """A ReadRangeResponse as received (the client's deserializer for ReadRange).

    protobuf copies every bytes field out of the message it parses, and again on each access to it; for entries
    of a Spark read (about 1 MiB) those copies were most of a reader's CPU besides the decompression. Big entries
    are decoded here instead, each payload a view into `data`, copied never or once by the reader (ReadHandle.read).
    A message whose first entry is under VIEW_MIN_BYTES goes to protobuf's own decoder: for small entries
    (a raw stream's events) its C loop is cheaper than this one per entry. The choice is per message: entries
    after a big first one are decoded here whatever their size, those after a small first one by protobuf.

    As protobuf does: proto3 defaults for absent fields (status 0 is STATUS_UNKNOWN), fields in any order, the
    last of a repeated scalar field wins, unknown fields and known ones of another wire type are skipped, a
    message cut short or field number 0 raises DecodeError. Unlike it, and on the safe side for a reader: a status
    is read as int64 (not cut to int32, so no out-of-range value reads as OK), a message that is not UTF-8 is read
    with replacement characters, and a group (wire types 3, 4, which proto3 has not) raises DecodeError."""
    view = memoryview(data)
    out = ReadRangeResponseView()
    for number, kind, value in fields(data, 0, len(data)):
        if number == _RANGE.ENTRIES_FIELD_NUMBER and kind == LENGTH:
            start, stop = value
            if not out.entries and stop - start < VIEW_MIN_BYTES:
                return pb.ReadRangeResponse.FromString(data)
            out.entries.append(_range_entry(data, view, start, stop))
        elif number == _RANGE.STATUS_FIELD_NUMBER and kind == VARINT:
            out.status = int64(value)
        elif number == _RANGE.MESSAGE_FIELD_NUMBER and kind == LENGTH:
            out.message = _text(data, value)
        elif number == _RANGE.DONE_FIELD_NUMBER and kind == VARINT:
            out.done = bool(value)
    return out


def _range_entry(data: bytes, view: memoryview, pos: int, end: int) -> ReadResponseView:
    entry = ReadResponseView()
    for number, kind, value in fields(data, pos, end):
        if number == _READ.PAYLOAD_FIELD_NUMBER and kind == LENGTH:
            entry.payload = view[value[0]:value[1]]
        elif kind == VARINT and number in _READ_VARINTS:
            setattr(entry, _READ_VARINTS[number], int64(value))
        elif number == _READ.DIGEST_FIELD_NUMBER and kind == FIXED32:
            entry.digest = value
        elif number == _READ.MESSAGE_FIELD_NUMBER and kind == LENGTH:
            entry.message = _text(data, value)
    return entry


# -- reading protobuf fields by hand (the node's AddRequest, the client's ReadRangeResponse) -----------------------

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5   # wire types


def fields(data, pos: int, end: int):
    """(field number, wire type, value) of data[pos:end] in order; a length-delimited value is its (start, end).
    A truncated field or varint, field number 0 and groups raise DecodeError, as protobuf's decoder does."""
    while pos < end:
        key, pos = read_varint(data, pos, end)
        number, wire_type = key >> 3, key & 7
        if not 0 < number < 1 << 29:
            raise DecodeError(f"invalid field number {number}")
        if wire_type == VARINT:
            value, pos = read_varint(data, pos, end)
        elif wire_type == LENGTH:
            length, pos = read_varint(data, pos, end)
            if length > end - pos:
                raise DecodeError("truncated length-delimited field")
            value, pos = (pos, pos + length), pos + length
        elif wire_type == FIXED32:
            if pos + 4 > end:
                raise DecodeError("truncated fixed32 field")
            value, pos = _U32.unpack_from(data, pos)[0], pos + 4
        elif wire_type == FIXED64:
            if pos + 8 > end:
                raise DecodeError("truncated fixed64 field")
            value, pos = int.from_bytes(data[pos:pos + 8], "little"), pos + 8
        else:
            raise DecodeError(f"unsupported wire type {wire_type}")
        yield number, wire_type, value


def read_varint(data, pos: int, end: int) -> tuple[int, int]:
    """(value as uint64, position after it) of the varint at data[pos]."""
    result = shift = 0
    while True:
        if pos >= end:
            raise DecodeError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result & _U64, pos
        shift += 7
        if shift >= 70:
            raise DecodeError("varint longer than 10 bytes")


def int64(value: int) -> int:
    """An int64 field's value from its varint (negative ones take ten bytes, two's complement)."""
    return value - (1 << 64) if value & _INT64_SIGN else value


def _text(data: bytes, span: tuple[int, int]) -> str:
    return data[span[0]:span[1]].decode("utf-8", errors="replace")
