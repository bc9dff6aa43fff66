"""Journal records: how each one is encoded and decoded, side by side, and how a frame is checked.

Every record is framed as ``u32 length | u32 crc32c(body) | body``; the body starts with a type byte:

| type       | body after the type byte                         | written by                        |
| ---------- | ------------------------------------------------ | --------------------------------- |
| ENTRY      | ledger, entry, piggybacked LAC, flags, digest,   | an add                            |
|            | then the payload                                 |                                   |
| KEY        | ledger; master key                               | a ledger's first add, fence, LAC  |
| FENCE      | ledger                                           | a fence (rule 6)                  |
| LAC        | ledger, explicit LAC                             | WriteLac                          |
| DELETE     | ledger (deleted from metadata)                   | garbage collection                |
| DURABLE    | its own offset in the segment                    | the writer, before every group    |
| CHECKPOINT | generation, delta number (0: a base), the        | a checkpoint once its file is in  |
|            | journal position it covers (segment, offset)     | place (storage.py)                |
| LINK       | the segment before this one (0: none) and        | the writer, after a segment's     |
|            | where its durable records end                    | first mark                        |

A DURABLE mark says everything before it in its segment is durable (storage_node/journal.py writes them,
storage_node/segments.py reads them back after a crash). A CHECKPOINT record says that checkpoint exists, and a
LINK record which segment came before this one and where it ended: replay (storage_node/replay.py) refuses to
start from an older checkpoint, or over a segment missing or cut short. Decoders take a body as the scan hands it
out (starting at the type byte) and return a named record; the file the bytes came from is the caller's.
A node from before CHECKPOINT and LINK records takes them for damage: there is no downgrade past them.
"""
from __future__ import annotations

import enum
import struct
from typing import NamedTuple, Union

import crc32c

FRAME = struct.Struct("<II")                # body length, crc32c(body)
ENTRY_HEAD = struct.Struct("<BqqqII")       # type, ledger, entry, piggybacked lac, flags, digest; payload follows
KEY_HEAD = struct.Struct("<Bq")             # type, ledger; master key follows
FENCE_BODY = struct.Struct("<Bq")           # type, ledger
LAC_BODY = struct.Struct("<Bqq")            # type, ledger, explicit lac
DELETE_BODY = struct.Struct("<Bq")          # type, ledger
DURABLE_BODY = struct.Struct("<Bq")         # type, its own offset
CHECKPOINT_BODY = struct.Struct("<Bqqqq")   # type, generation, delta number (0: a base), segment, offset covered
LINK_BODY = struct.Struct("<Bqq")           # type, the previous segment (0: none), its durable end
MARK_SIZE = FRAME.size + DURABLE_BODY.size
ENTRY_PAYLOAD_OFFSET = FRAME.size + ENTRY_HEAD.size
MAX_BODY = 1 << 30                          # no record is ever this large; a bigger length is damage


class RecordType(enum.IntEnum):
    ENTRY = 1
    KEY = 2
    FENCE = 3
    LAC = 4
    DELETE = 5
    DURABLE = 6
    CHECKPOINT = 7
    LINK = 8


_MIN_BODY = {
    RecordType.ENTRY: ENTRY_HEAD.size,
    RecordType.KEY: KEY_HEAD.size + 1,
    RecordType.FENCE: FENCE_BODY.size,
    RecordType.LAC: LAC_BODY.size,
    RecordType.DELETE: DELETE_BODY.size,
    RecordType.DURABLE: DURABLE_BODY.size,
    RecordType.CHECKPOINT: CHECKPOINT_BODY.size,
    RecordType.LINK: LINK_BODY.size,
}


def _frame(body: bytes) -> bytes:
    return FRAME.pack(len(body), crc32c.crc32c(body)) + body


# -- the records, decoded -----------------------------------------------------------------------

class EntryRecord(NamedTuple):
    """The head of an ENTRY record; its payload follows the head."""

    ledger_id: int
    entry_id: int
    lac: int            # the writer's LAC when it sent the entry (piggybacked)
    flags: int
    digest: int


class KeyRecord(NamedTuple):
    ledger_id: int
    master_key: bytes


class FenceRecord(NamedTuple):
    ledger_id: int


class LacRecord(NamedTuple):
    ledger_id: int
    lac: int


class DeleteRecord(NamedTuple):
    ledger_id: int


class CheckpointRecord(NamedTuple):
    """A checkpoint whose file was in place (storage_node/checkpoint.py), and the journal position it covers."""

    generation: int
    number: int         # of the delta; 0 for the base of its generation
    segment: int
    offset: int


class LinkRecord(NamedTuple):
    """The segment written before the one this record starts (0: none) and where that one's durable records ended."""

    previous_segment: int
    previous_end: int


# -- each record's encoder and decoder ----------------------------------------------------------

def encode_entry_head(ledger_id: int, entry_id: int, lac: int, flags: int, digest: int, payload) -> bytes:
    """Frame + body head of an ENTRY record; the payload is written after it unchanged (no copy). Runs once
    per add, so what it looks up is bound once, here."""
    head = _pack_entry_head(_ENTRY, ledger_id, entry_id, lac, flags, digest)
    return _pack_frame(_ENTRY_HEAD_SIZE + len(payload), _crc32c(payload, _crc32c(head))) + head


_pack_entry_head, _pack_frame, _crc32c = ENTRY_HEAD.pack, FRAME.pack, crc32c.crc32c
_ENTRY, _ENTRY_HEAD_SIZE = int(RecordType.ENTRY), ENTRY_HEAD.size


def decode_entry(body, at: int = 0) -> EntryRecord:
    """The head of the ENTRY record whose body starts at `at`."""
    _, ledger_id, entry_id, lac, flags, digest = ENTRY_HEAD.unpack_from(body, at)
    return EntryRecord(ledger_id, entry_id, lac, flags, digest)


def decode_entry_frame(frame) -> EntryRecord:
    """The head of the ENTRY record a checked frame holds whole (as read back from a file); its payload is
    frame[ENTRY_PAYLOAD_OFFSET:]. Raises ValueError when the frame holds another kind of record."""
    kind = frame[FRAME.size]
    if kind != RecordType.ENTRY:
        raise ValueError(f"the record there is {RecordType(kind).name}, not an entry")
    return decode_entry(frame, FRAME.size)


def encode_key(ledger_id: int, master_key: bytes) -> bytes:
    return _frame(KEY_HEAD.pack(RecordType.KEY, ledger_id) + master_key)


def decode_key(body) -> KeyRecord:
    return KeyRecord(KEY_HEAD.unpack_from(body, 0)[1], bytes(body[KEY_HEAD.size:]))


def encode_fence(ledger_id: int) -> bytes:
    return _frame(FENCE_BODY.pack(RecordType.FENCE, ledger_id))


def decode_fence(body) -> FenceRecord:
    return FenceRecord(FENCE_BODY.unpack_from(body, 0)[1])


def encode_lac(ledger_id: int, lac: int) -> bytes:
    return _frame(LAC_BODY.pack(RecordType.LAC, ledger_id, lac))


def decode_lac(body) -> LacRecord:
    _, ledger_id, lac = LAC_BODY.unpack_from(body, 0)
    return LacRecord(ledger_id, lac)


def encode_delete(ledger_id: int) -> bytes:
    return _frame(DELETE_BODY.pack(RecordType.DELETE, ledger_id))


def decode_delete(body) -> DeleteRecord:
    return DeleteRecord(DELETE_BODY.unpack_from(body, 0)[1])


def encode_checkpoint(record: CheckpointRecord) -> bytes:
    return _frame(CHECKPOINT_BODY.pack(RecordType.CHECKPOINT, *record))


def decode_checkpoint(body) -> CheckpointRecord:
    return CheckpointRecord(*CHECKPOINT_BODY.unpack_from(body, 0)[1:])


def encode_link(record: LinkRecord) -> bytes:
    return _frame(LINK_BODY.pack(RecordType.LINK, *record))


def decode_link(body) -> LinkRecord:
    return LinkRecord(*LINK_BODY.unpack_from(body, 0)[1:])


# -- durable marks (no decoder: a mark is checked where it stands) ------------------------------

def encode_durable_mark(offset: int) -> bytes:
    """The mark that starts the group written at offset (storage_node/journal.py: durable marks)."""
    return _frame(DURABLE_BODY.pack(RecordType.DURABLE, offset))


def is_durable_mark(data, pos: int) -> bool:
    """Whether a durable mark naming its own offset stands at pos (a copy elsewhere, say inside a
    payload, names another offset)."""
    return data[pos:pos + MARK_SIZE] == encode_durable_mark(pos)


# -- any record ---------------------------------------------------------------------------------

Record = Union[EntryRecord, KeyRecord, FenceRecord, LacRecord, DeleteRecord, CheckpointRecord, LinkRecord]
_DECODERS = {
    RecordType.ENTRY: decode_entry,
    RecordType.KEY: decode_key,
    RecordType.FENCE: decode_fence,
    RecordType.LAC: decode_lac,
    RecordType.DELETE: decode_delete,
    RecordType.CHECKPOINT: decode_checkpoint,
    RecordType.LINK: decode_link,
}


def decode(body) -> Record:
    """The record a checked body holds (a scan hands out every record but durable marks)."""
    return _DECODERS[body[0]](body)


def frame_problem(data, pos: int, end: int) -> str | None:
    """Why the record at pos is not a valid record, or None if it is."""
    if end - pos < FRAME.size:
        return "partial record header"
    length, crc = FRAME.unpack_from(data, pos)
    if length == 0 or length > MAX_BODY:
        return f"impossible record length {length}"
    body_start = pos + FRAME.size
    if body_start + length > end:
        return f"record of {length} bytes runs past the end of the file"
    body = memoryview(data)[body_start:body_start + length]
    if crc32c.crc32c(body) != crc:
        return "checksum mismatch"
    try:
        kind = RecordType(body[0])
    except ValueError:
        return f"unknown record type {body[0]}"
    if length < _MIN_BODY[kind]:
        return f"{kind.name} record too short ({length} bytes)"
    return None
