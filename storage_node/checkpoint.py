"""Checkpoints: a snapshot of the index and ledger states with the journal position it covers.

Start-up loads the snapshot and replays the journal only from that position. The snapshot is
written to a temporary file, fsynced, renamed over the old one and the directory fsynced, so a
crash leaves either the old or the new snapshot; a CRC guards against anything else (a damaged
snapshot is ignored and the whole journal replayed, as long as compaction has not removed any of it:
after that the snapshot is the only record of those files and replay refuses to start without it).
Arrays are stored in native byte order: a snapshot is only read back by the machine that wrote it.
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import struct
from array import array

import crc32c

from storage_node.entry_index import LedgerIndex
from storage_node.ledger_state import LedgerState
from storage_node.segments import Position, fsync_directory

SNAPSHOT_NAME = "snapshot"
_MAGIC = b"LSNAP001"
_HEADER = struct.Struct("<8sIQ")        # magic, crc32c(body), body length
_POSITION = struct.Struct("<qqq")       # segment, offset, ledger count
_LEDGER = struct.Struct("<qBqqqHqq")    # id, fenced, lac, last entry, index base, key length, dense, overflow
_OVERFLOW = struct.Struct("<qqi")       # entry id, location, length


class SnapshotDamaged(ValueError):
    """The snapshot cannot be trusted; replay the whole journal instead."""


def encode_snapshot(position: Position, ledgers: dict[int, LedgerState]) -> bytes:
    chunks = [_POSITION.pack(position.segment, position.offset, len(ledgers))]
    for state in ledgers.values():
        index = state.index
        chunks.append(_LEDGER.pack(
            state.ledger_id, state.fenced, state.last_add_confirmed, state.last_entry_id, index.base,
            len(state.master_key), len(index.locations), len(index.overflow),
        ))
        chunks.append(state.master_key)
        chunks.append(index.locations.tobytes())
        chunks.append(index.lengths.tobytes())
        chunks.extend(_OVERFLOW.pack(e, loc, n) for e, (loc, n) in index.overflow.items())
    body = b"".join(chunks)
    return _HEADER.pack(_MAGIC, crc32c.crc32c(body), len(body)) + body


def decode_snapshot(blob: bytes) -> tuple[Position, dict[int, LedgerState]]:
    if len(blob) < _HEADER.size:
        raise SnapshotDamaged("shorter than its header")
    magic, crc, length = _HEADER.unpack_from(blob, 0)
    body = memoryview(blob)[_HEADER.size:]
    if magic != _MAGIC:
        raise SnapshotDamaged(f"unknown format {magic!r}")
    if len(body) != length or crc32c.crc32c(body) != crc:
        raise SnapshotDamaged("checksum or length mismatch")
    try:
        return _decode_body(body)
    except (struct.error, ValueError) as exc:
        raise SnapshotDamaged(f"malformed body: {exc}") from exc


def _decode_body(body: memoryview) -> tuple[Position, dict[int, LedgerState]]:
    segment, offset, count = _POSITION.unpack_from(body, 0)
    pos = _POSITION.size
    ledgers = {}
    for _ in range(count):
        ledger_id, fenced, lac, last_entry, base, key_len, dense, overflow = _LEDGER.unpack_from(body, pos)
        pos += _LEDGER.size
        key = bytes(body[pos:pos + key_len])
        pos += key_len
        index = LedgerIndex(base)
        index.locations = _array("q", body[pos:pos + 8 * dense])
        pos += 8 * dense
        index.lengths = _array("i", body[pos:pos + 4 * dense])
        pos += 4 * dense
        for _ in range(overflow):
            entry_id, location, length = _OVERFLOW.unpack_from(body, pos)
            pos += _OVERFLOW.size
            index.overflow[entry_id] = (location, length)
        index.recount()
        ledgers[ledger_id] = LedgerState(ledger_id, key, bool(fenced), lac, last_entry, index)
    if pos != len(body):
        raise ValueError(f"{len(body) - pos} trailing bytes")
    return Position(segment, offset), ledgers


def _array(typecode: str, data: memoryview) -> array:
    values = array(typecode)
    values.frombytes(data)
    return values


def save_snapshot(data_dir: pathlib.Path, blob: bytes) -> None:
    """Atomically replace the snapshot (blocking: run it in a worker thread)."""
    tmp = data_dir / (SNAPSHOT_NAME + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        with contextlib.suppress(OSError):   # a partial snapshot would only take space (on a full disk, say)
            tmp.unlink()
        raise
    os.replace(tmp, data_dir / SNAPSHOT_NAME)
    fsync_directory(data_dir)


def load_snapshot(data_dir: pathlib.Path) -> tuple[Position, dict[int, LedgerState]] | None:
    """The last snapshot, None if there is none; raises SnapshotDamaged if it cannot be trusted."""
    path = data_dir / SNAPSHOT_NAME
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return None
    return decode_snapshot(blob)
