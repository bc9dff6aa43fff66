"""Checkpoints: a snapshot of the index and ledger states with the journal position it covers.

Start-up loads the snapshot and replays the journal only from that position. A checkpoint is either a whole
snapshot (the file `snapshot`, the base of a generation) or a delta (`snapshot-delta-G-N`, the Nth since the
base of generation G): what changed since the checkpoint before it, so that a checkpoint costs what changed, not
what the node holds (a whole snapshot of 10 million entries is 120 MB). A delta holds the ledgers dropped since,
and of each ledger that changed its fields, its master key, the dense slots appended since, the slots changed
below them (compaction's moves, recovery adds into holes) and, if it changed, its overflow; a ledger new since, or
one whose dense window moved (entry_index.py), is held whole (the second also among the dropped, so that a node of
the version before, which knows no moved window, loads it too). The state a checkpoint covers is the base with its
generation's deltas applied in order (1, 2, ... without a gap); a delta of another generation is left over from
before the last base and ignored.
storage.py writes a new base when the deltas since the last one add up to its size (or number MAX_DELTAS), so
loading stays bounded by twice the state and the writes amortise to what changed; a new base removes the older
generations' deltas.

The event loop only copies what a checkpoint holds (Encoded: the index arrays' bytes and the packed fields, so the
loop may go on changing the index); the worker thread that saves it computes its CRC and writes the copies as
they are. Joining them into one blob and framing it, as encoding did before, took the loop three times as long as
the copies: 163-165 ms for a whole snapshot of 10 million entries against 53-54 ms (history_bench).

Once a checkpoint's file is in place, storage.py journals a CHECKPOINT record naming it (generation, delta
number, position): replay (storage_node/replay.py) then refuses to start from an older checkpoint, as after a delta
was deleted or an older snapshot restored, which would otherwise replay around files compaction deleted on the
strength of the newer one. Generations only grow, so (generation, delta number) orders checkpoints.

Each file is written to a temporary file, fsynced, renamed into place and the directory fsynced, so a crash
leaves it whole or absent; a CRC guards against anything else (a damaged one is ignored and the whole journal
replayed, as long as compaction has not removed any of it: after that the checkpoints are the only record of
those files and replay refuses to start without them). Arrays are stored in native byte order: a checkpoint is
only read back by the machine that wrote it. A snapshot of the format before deltas (LSNAP001) loads as the
base of generation 0.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import struct
from array import array
from typing import Iterable

import crc32c

from storage_node.entry_index import LedgerIndex, OverflowRuns
from storage_node.file_modes import new_file
from storage_node.ledger_state import LedgerState
from storage_node.segments import Position, fsync_directory

SNAPSHOT_NAME = "snapshot"
DELTA_PREFIX = "snapshot-delta-"
_MAGIC_V1 = b"LSNAP001"                 # a whole snapshot without a generation (read only)
_MAGIC = b"LSNAP002"                    # a whole snapshot: the base of its generation
_DELTA_MAGIC = b"LDELT001"
_HEADER = struct.Struct("<8sIQ")        # magic, crc32c(body), body length
_CHAIN = struct.Struct("<qq")           # generation, delta number (0 for a base)
_POSITION = struct.Struct("<qqq")       # segment, offset, ledger count
_LEDGER = struct.Struct("<qBqqqHqq")    # id, fenced, lac, last entry, index base, key length, dense, overflow
_OVERFLOW = struct.Struct("<qqi")       # entry id, location, length
_DROPPED = struct.Struct("<q")          # ledger count, then their ids
# id, fenced, lac, last entry, index base, key length, first slot held, slots held from it, changed slots below
# it, overflow entries (-1: unchanged)
_CHANGE = struct.Struct("<qBqqqHqqqq")
_PATCH = struct.Struct("<qqi")          # slot, location, length


class SnapshotDamaged(ValueError):
    """The snapshot cannot be trusted; replay the whole journal instead."""


def encode_snapshot(position: Position, ledgers: dict[int, LedgerState], generation: int) -> Encoded:
    """A whole snapshot, the base of `generation`: one no file in the data directory has had (newest_generation),
    so that no delta left there belongs to it."""
    chunks = [_CHAIN.pack(generation, 0), _POSITION.pack(position.segment, position.offset, len(ledgers))]
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
    return Encoded(_MAGIC, generation, 0, chunks)


def encode_delta(position: Position, generation: int, number: int, changed: Iterable[LedgerState],
                 dropped: Iterable[int]) -> Encoded:
    """Delta `number` of `generation`: the ledgers dropped, then what changed in each of `changed` since the
    checkpoint before (LedgerIndex.changes; the caller then marks them checkpointed)."""
    changed = list(changed)
    # A ledger whose window moved (entry_index.py) is dropped and held whole again, as a new one would be.
    dropped = [*dropped, *(state.ledger_id for state in changed if state.index.rewritten())]
    chunks = [_CHAIN.pack(generation, number), _POSITION.pack(position.segment, position.offset, len(changed)),
              _DROPPED.pack(len(dropped)), array("q", dropped).tobytes()]
    for state in changed:
        index = state.index
        first, patches, overflow = index.changes()
        chunks.append(_CHANGE.pack(
            state.ledger_id, state.fenced, state.last_add_confirmed, state.last_entry_id, index.base,
            len(state.master_key), first, len(index.locations) - first, len(patches),
            -1 if overflow is None else len(overflow),
        ))
        chunks.append(state.master_key)
        chunks.append(index.locations[first:].tobytes())
        chunks.append(index.lengths[first:].tobytes())
        chunks.extend(_PATCH.pack(slot, index.locations[slot], index.lengths[slot]) for slot in patches)
        if overflow is not None:
            chunks.extend(_OVERFLOW.pack(e, loc, n) for e, (loc, n) in overflow.items())
    return Encoded(_DELTA_MAGIC, generation, number, chunks)


class Encoded:
    """A checkpoint as the event loop encodes it: its file's magic, which file it is, and its body as chunks that
    are copies of what it holds (never views of the index, which the loop goes on changing while a worker thread
    saves it). The header, with the CRC of the body, is computed where it is written (save_snapshot, save_delta):
    crc32c releases the GIL on large chunks, and the chunks are written as they are, never joined."""

    __slots__ = ("magic", "generation", "number", "chunks", "size")

    def __init__(self, magic: bytes, generation: int, number: int, chunks: list[bytes]):
        self.magic = magic
        self.generation = generation
        self.number = number            # 0 for a base
        self.chunks = chunks
        self.size = _HEADER.size + sum(map(len, chunks))    # of the file

    def header(self) -> bytes:
        crc = 0
        for chunk in self.chunks:
            crc = crc32c.crc32c(chunk, crc)
        return _HEADER.pack(self.magic, crc, self.size - _HEADER.size)

    def __bytes__(self) -> bytes:
        """The file's bytes, joined (tests; a save writes the chunks as they are)."""
        return self.header() + b"".join(self.chunks)


@dataclasses.dataclass(frozen=True)
class Chain:
    """Where the checkpoints on disk stand: the base's generation, the last delta's number (0: none yet), and
    the bytes of the base and of its deltas."""

    generation: int
    deltas: int
    base_bytes: int
    delta_bytes: int


def decode_snapshot(blob: bytes) -> tuple[Position, dict[int, LedgerState]]:
    """A whole snapshot's position and ledgers."""
    _, position, ledgers = _decode_base(blob)
    return position, ledgers


def _decode_base(blob: bytes) -> tuple[int, Position, dict[int, LedgerState]]:
    magic, body = _checked(blob, (_MAGIC, _MAGIC_V1))
    try:
        generation, pos = 0, 0
        if magic == _MAGIC:
            generation, number = _CHAIN.unpack_from(body, 0)
            if number != 0:
                raise ValueError(f"a base numbered {number}")
            pos = _CHAIN.size
        position, ledgers = _decode_body(body, pos)
    except (struct.error, ValueError) as exc:
        raise SnapshotDamaged(f"malformed body: {exc}") from exc
    return generation, position, ledgers


def _checked(blob: bytes, magics: tuple[bytes, ...]) -> tuple[bytes, memoryview]:
    if len(blob) < _HEADER.size:
        raise SnapshotDamaged("shorter than its header")
    magic, crc, length = _HEADER.unpack_from(blob, 0)
    body = memoryview(blob)[_HEADER.size:]
    if magic not in magics:
        raise SnapshotDamaged(f"unknown format {magic!r}")
    if len(body) != length or crc32c.crc32c(body) != crc:
        raise SnapshotDamaged("checksum or length mismatch")
    return magic, body


def _decode_body(body: memoryview, pos: int) -> tuple[Position, dict[int, LedgerState]]:
    segment, offset, count = _POSITION.unpack_from(body, pos)
    pos += _POSITION.size
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
        pos = _decode_overflow(body, pos, overflow, index.overflow)
        index.recount()
        index.mark_checkpointed()
        ledgers[ledger_id] = LedgerState(ledger_id, key, bool(fenced), lac, last_entry, index)
    if pos != len(body):
        raise ValueError(f"{len(body) - pos} trailing bytes")
    return Position(segment, offset), ledgers


def _decode_overflow(body: memoryview, pos: int, count: int, into: OverflowRuns) -> int:
    for _ in range(count):
        entry_id, location, length = _OVERFLOW.unpack_from(body, pos)
        pos += _OVERFLOW.size
        into.put(entry_id, location, length)
    return pos


def apply_delta(blob: bytes, generation: int, number: int, ledgers: dict[int, LedgerState],
                changed: set[int]) -> Position:
    """Apply delta `number` of `generation` to the ledgers the checkpoints before it hold; its position. The ids
    of the ledgers it changed are added to `changed`: the caller recounts their indexes (LedgerIndex.recount)
    once the last delta is applied."""
    _, body = _checked(blob, (_DELTA_MAGIC,))
    try:
        return _apply_delta(body, generation, number, ledgers, changed)
    except (struct.error, ValueError) as exc:
        raise SnapshotDamaged(f"malformed delta {generation}-{number}: {exc}") from exc


def _apply_delta(body: memoryview, generation: int, number: int, ledgers: dict[int, LedgerState],
                 changed: set[int]) -> Position:
    if _CHAIN.unpack_from(body, 0) != (generation, number):
        raise ValueError(f"it says it is delta {_CHAIN.unpack_from(body, 0)}")
    pos = _CHAIN.size
    segment, offset, count = _POSITION.unpack_from(body, pos)
    pos += _POSITION.size
    (dropped,) = _DROPPED.unpack_from(body, pos)
    pos += _DROPPED.size
    for ledger_id in _array("q", body[pos:pos + 8 * dropped]):
        ledgers.pop(ledger_id, None)
    pos += 8 * dropped
    for _ in range(count):
        (ledger_id, fenced, lac, last_entry, base, key_len, first, held, patches,
         overflow) = _CHANGE.unpack_from(body, pos)
        pos += _CHANGE.size
        key = bytes(body[pos:pos + key_len])
        pos += key_len
        state = ledgers.get(ledger_id)
        if state is None:
            if first != 0:
                raise ValueError(f"ledger {ledger_id} changed from slot {first} but no checkpoint before holds it")
            state = ledgers[ledger_id] = LedgerState(ledger_id, key, index=LedgerIndex(base))
        index = state.index
        if first != len(index.locations) or (index.base != base and first != 0):
            raise ValueError(f"ledger {ledger_id} changed from slot {first} of base {base}, but the checkpoints "
                             f"before hold {len(index.locations)} slots of base {index.base}")
        state.master_key, state.fenced, state.last_add_confirmed, state.last_entry_id = key, bool(fenced), lac, \
            last_entry
        index.base = base
        index.locations.frombytes(body[pos:pos + 8 * held])
        pos += 8 * held
        index.lengths.frombytes(body[pos:pos + 4 * held])
        pos += 4 * held
        for _ in range(patches):
            slot, location, length = _PATCH.unpack_from(body, pos)
            pos += _PATCH.size
            if not 0 <= slot < first:
                raise ValueError(f"ledger {ledger_id} changed slot {slot}, outside the {first} held before")
            index.locations[slot], index.lengths[slot] = location, length
        if overflow >= 0:
            index.overflow = OverflowRuns()
            pos = _decode_overflow(body, pos, overflow, index.overflow)
        changed.add(ledger_id)
    if pos != len(body):
        raise ValueError(f"{len(body) - pos} trailing bytes")
    return Position(segment, offset)


def _array(typecode: str, data: memoryview) -> array:
    values = array(typecode)
    values.frombytes(data)
    return values


def save_snapshot(data_dir: pathlib.Path, snapshot: Encoded) -> None:
    """Atomically replace the snapshot (blocking: run it in a worker thread); then remove the deltas of older
    generations (a base's own generation has none yet), and any delta a crash left half-written."""
    _save(data_dir, SNAPSHOT_NAME, snapshot)
    stale = [path for path, (g, _) in _delta_files(data_dir) if g != snapshot.generation]
    stale += data_dir.glob(DELTA_PREFIX + "*.tmp")
    for path in stale:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if stale:
        fsync_directory(data_dir)


def save_delta(data_dir: pathlib.Path, delta: Encoded) -> None:
    """Put a delta in place (blocking: run it in a worker thread)."""
    _save(data_dir, delta_name(delta.generation, delta.number), delta)


def delta_name(generation: int, number: int) -> str:
    return f"{DELTA_PREFIX}{generation}-{number}"


def _save(data_dir: pathlib.Path, name: str, encoded: Encoded) -> None:
    tmp = data_dir / (name + ".tmp")
    try:
        with open(tmp, "wb", opener=new_file) as f:
            f.write(encoded.header())
            f.writelines(encoded.chunks)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        with contextlib.suppress(OSError):   # a partial file would only take space (on a full disk, say)
            tmp.unlink()
        raise
    os.replace(tmp, data_dir / name)
    fsync_directory(data_dir)


def newest_generation(data_dir: pathlib.Path) -> int:
    """The highest generation the delta files in data_dir name, damaged or stale ones included (0: none). A new
    base takes a generation above it, above the loaded base's and above any a CHECKPOINT record in the journal
    names (replay), so no delta left from before is taken for one of its own. (A damaged base's own generation
    is not trusted; its deltas, if any, name it.)"""
    return max((g for _, (g, _) in _delta_files(data_dir)), default=0)


def delta_of(name: str) -> tuple[int, int] | None:
    """(generation, number) of the delta file named `name`, None for any other name (a temporary file too). A delta
    file is complete once it has its name (renamed into place) and never written again: a name is never reused."""
    if not name.startswith(DELTA_PREFIX):
        return None
    generation, _, number = name[len(DELTA_PREFIX):].partition("-")
    return (int(generation), int(number)) if generation.isdigit() and number.isdigit() else None


def _delta_files(data_dir: pathlib.Path) -> list[tuple[pathlib.Path, tuple[int, int]]]:
    """The delta files in data_dir with their (generation, number), in no order."""
    return [(path, key) for path in data_dir.glob(DELTA_PREFIX + "*") if (key := delta_of(path.name)) is not None]


def load_checkpoints(data_dir: pathlib.Path) -> tuple[Position, dict[int, LedgerState], Chain] | None:
    """The base with its generation's deltas applied, and where the chain stands; None if there is no snapshot.
    Raises SnapshotDamaged if any of them cannot be trusted, or a delta is missing between two others."""
    try:
        blob = (data_dir / SNAPSHOT_NAME).read_bytes()
    except FileNotFoundError:
        return None
    generation, position, ledgers = _decode_base(blob)
    numbers = sorted(n for _, (g, n) in _delta_files(data_dir) if g == generation)
    for expected, number in enumerate(numbers, start=1):
        if number != expected:
            raise SnapshotDamaged(f"delta {expected} of generation {generation} is missing (the next one is "
                                  f"{number})")
    delta_bytes, changed = 0, set()
    for number in numbers:
        delta = (data_dir / delta_name(generation, number)).read_bytes()
        before, position = position, apply_delta(delta, generation, number, ledgers, changed)
        if position < before:
            raise SnapshotDamaged(f"delta {number} of generation {generation} covers the journal up to {position}, "
                                  f"before the checkpoint it follows ({before})")
        delta_bytes += len(delta)
    for ledger_id in changed:
        if ledger_id in ledgers:
            ledgers[ledger_id].index.recount()
            ledgers[ledger_id].index.mark_checkpointed()
    return position, ledgers, Chain(generation, len(numbers), len(blob), delta_bytes)
