"""Compaction: reclaim the disk space of sealed journal segments and compacted files that hold mostly
entries nobody can read any more (their ledger was garbage collected, or a recovery add rewrote them).

One round, run by storage.Storage.compact on the event loop (only the copy runs in a worker thread):

1. plan: live bytes per file, as the in-memory index keeps them (entry_index.py LiveBytes); candidates are
   journal segments below the durable position's segment (sealed and fully applied) and every compacted file. A
   file with no live bytes is simply deleted; one whose live fraction is below the threshold is rewritten. Small
   files are merged: once MERGE_SMALL_FILES of the files kept are below a quarter of a journal segment,
   the smallest of them, up to a segment's worth, are rewritten as well. Every round that copies anything
   writes a compacted file, which stays as long as what it holds is live (a stream kept for good), and a
   restart seals its segment early: without merging, a node running for months would hold tens of thousands
   of small files, each a descriptor once read and a stat in every look at the disk. A file with a record a
   copy could not read back intact is never copied again (it would stop every round); files without live
   bytes are still deleted when a copy fails.
2. copy: the live records of the rewritten files, as they are (frame, CRC and all), go into one new
   ``compacted-N.log``; each is verified while read; the file and the directory are fsynced.
3. switch: each copied entry's index slot is pointed at its copy if it still points at the old place
   (one synchronous step on the loop, like every read, so a read sees either the old or the new
   location and both files exist: a read never answers NO_ENTRY for a live entry, rule 8).
4. checkpoint: the snapshot now covers a position past every source segment and names the new
   locations; the KEY/FENCE/LAC records of the source segments live on in its ledger states. Its CHECKPOINT
   record must be durable before anything is deleted on its strength (journaled again if its group failed; if
   that fails too, the round deletes nothing): a restart that finds an older checkpoint (the newest one's file
   lost) then refuses to start instead of replaying around the deleted files (storage_node/replay.py).
5. delete the sources that no index slot points into any more, closing their read descriptors; a journal
   segment only below the newest checkpoint's position, where replay starts (a checkpoint is not written again
   while nothing changed, and its own CHECKPOINT record can seal the segment it covers): so the newest
   checkpoint's record, which lies at or after its position, is never deleted.

Crash at any point, and what replay (storage_node/replay.py) restores:
- before 4: the previous snapshot still points into the sources, which are all still there; the new
  compacted file is an orphan nobody points to, deleted by the next round as a file with no live bytes.
- after 4, before or during 5: the new snapshot points into the compacted file (complete: fsynced in
  2 before any slot could point at it) and replay starts past the sources, so the remaining sources are
  never read; the next round finds them without live bytes and deletes them.
- after 5: the snapshot plus the journal tail hold exactly the live data.
A snapshot therefore stops being disposable once a segment has gone: replay refuses to start without
one, or with an older one than the journal records, rather than replay a journal with a hole in it. Ledger
deletions are journaled (DELETE records) under the checkpoint lock, so no snapshot ever omits a ledger whose
older records follow its position.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Iterable, NamedTuple

from storage_node.entry_index import pack, unpack
from storage_node.errors import UncopyableRecordError
from storage_node.file_modes import FILE_MODE
from storage_node.ledger_state import LedgerState
from storage_node.segments import compacted_path, data_file_path, fsync_directory, read_record

_COPY_CHUNK = 8 << 20       # bytes gathered before one write to the compacted file
MERGE_SMALL_FILES = 16      # small files kept by a round's plan that make it merge them


@dataclasses.dataclass(frozen=True)
class CompactionPlan:
    rewrite: tuple[int, ...]        # files whose live records are copied, then deleted
    drop: tuple[int, ...]           # files without live records: deleted after the checkpoint
    live_bytes: int                 # to copy
    reclaim_bytes: int              # freed once the sources are deleted

    @property
    def sources(self) -> tuple[int, ...]:
        return self.rewrite + self.drop

    def __bool__(self) -> bool:
        return bool(self.sources)


def plan_compaction(sizes: dict[int, int], live: dict[int, int], threshold: float, small_bytes: int = 0,
                    merge_bytes: int = 0, uncopyable: frozenset[int] = frozenset()) -> CompactionPlan:
    """Which candidate files (number -> size) to rewrite or drop, given live bytes per file number: drop the
    files without live bytes, rewrite those whose live fraction is below threshold, and, when at least
    MERGE_SMALL_FILES of the others are smaller than small_bytes, rewrite the smallest of those too, as many as
    fit in merge_bytes (merged into the round's one compacted file). A threshold of 0 rewrites nothing, and the
    uncopyable files (a damaged record stopped a copy of them) are only ever dropped.

    Pure: the caller passes only files that are sealed (journal segments below the durable position,
    and compacted files).
    """
    rewrite, drop, kept_small = [], [], []
    for number in sorted(sizes):
        size, used = sizes[number], live.get(number, 0)
        if used == 0:
            drop.append(number)
        elif number in uncopyable:
            continue
        elif size and used / size < threshold:
            rewrite.append(number)
        elif threshold and size < small_bytes:
            kept_small.append(number)
    if len(kept_small) >= MERGE_SMALL_FILES:
        merged = 0
        for number in sorted(kept_small, key=lambda n: (sizes[n], n)):
            merged += sizes[number]
            if merged > merge_bytes:
                break
            rewrite.append(number)
        rewrite.sort()
    live_total = sum(live[number] for number in rewrite)
    reclaim = sum(sizes[number] for number in rewrite + drop)
    return CompactionPlan(tuple(rewrite), tuple(drop), live_total, reclaim - live_total)


class Move(NamedTuple):
    location: int
    length: int
    state: LedgerState
    entry_id: int


def moves_out_of(ledgers: Iterable[LedgerState], sources: set[int]) -> list[Move]:
    """Every indexed record of `ledgers` stored in one of the source files, in file order (a sequential copy). The
    caller passes the ledgers with records there (LiveBytes.holding), and only their slots in those files are
    searched."""
    moves = [Move(location, length, state, entry_id)
             for state in ledgers
             for entry_id, location, length in state.index.records_in(sources)]
    moves.sort(key=lambda move: move.location)
    return moves


def copy_records(journal_dir: pathlib.Path, number: int, records: list[tuple[int, int]]) -> list[int]:
    """Copy (location, length) records into compacted file `number`, verified and fsynced; returns the
    new packed locations. Blocking: run it in a worker thread. On any failure the partial file is removed
    (and UncopyableRecordError raised for a damaged record), so nothing ever points into it."""
    path = compacted_path(journal_dir, number)
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    sources: dict[int, int] = {}
    try:
        locations, chunk, offset, written = [], [], 0, 0
        for location, length in records:
            segment, source_offset = unpack(location)
            fd = sources.get(segment)
            if fd is None:
                fd = sources[segment] = os.open(data_file_path(journal_dir, segment), os.O_RDONLY)
            try:
                chunk.append(read_record(fd, source_offset, length))
            except (ValueError, OSError) as exc:     # damaged, or the disk cannot read it back
                raise UncopyableRecordError(
                    f"cannot compact file {segment}: the record at offset {source_offset} cannot be read back "
                    f"intact ({exc}); the file is kept and reads of that entry answer ERROR", segment
                ) from exc
            locations.append(pack(number, offset))
            offset += length
            if offset - written >= _COPY_CHUNK:
                written += _write_all(out, chunk, written)
                chunk = []
        _write_all(out, chunk, written)
        os.fsync(out)
    except BaseException:
        os.close(out)
        path.unlink(missing_ok=True)
        raise
    finally:
        for fd in sources.values():
            os.close(fd)
    os.close(out)
    fsync_directory(journal_dir)
    return locations


def _write_all(fd: int, chunk: list[bytes], at: int) -> int:
    data = memoryview(b"".join(chunk))
    total = len(data)
    while data:
        n = os.pwrite(fd, data, at)
        data, at = data[n:], at + n
    return total
