"""Start-up recovery: load the last checkpoint, then replay the journal from the position it covers.

Replay restores entries (index, last entry, piggybacked LAC), master keys, fence flags and explicit
LACs, and forgets ledgers at their DELETE record. Every ledger it restores counts as first seen at replay
time, so garbage collection's grace starts again after a restart. A torn end of the last segment (damage
after its last durable mark: the last group, cut short by a crash and never acknowledged; see
storage_node/segments.py) is truncated away; any other damage stops the node (rule 8: better down than
answering "no such entry" for something it acknowledged).

Once compaction has removed a segment (the journal no longer starts at segment 1, or compacted files
exist), only the checkpoint describes what those files held: without a usable snapshot the node
refuses to start instead of replaying a journal with a hole in it.

Two records tell replay that what it found is not all there was, and it then refuses to start too:
- a CHECKPOINT record newer than the checkpoint loaded: that checkpoint's files were lost (deleted deltas, an
  older snapshot restored), and compaction may have removed files only it describes. Every file compaction
  deletes lies below the position of a checkpoint whose record is durable, and that record lies at or after the
  position, so the newest such record is never deleted (storage.py Storage.compact). Ignored when the journal
  is whole (it starts at segment 1, with no compacted file): then nothing was removed, and replaying it from
  the older checkpoint restores everything.
- a LINK record (storage_node/journal.py) naming a segment at or after the checkpoint's own that was not the
  segment replayed just before, or one whose records end short of where the LINK says: a segment after the
  checkpoint was deleted or cut short at a record boundary (segment numbers are shared with compacted files,
  so a gap in them says nothing). A segment whose LINK names one below the checkpoint's is not checked:
  compaction removes those. Segments from before LINK records are not checked.
"""
from __future__ import annotations

import dataclasses
import pathlib
import time

from storage_node.checkpoint import (
    SNAPSHOT_NAME,
    Chain,
    SnapshotDamaged,
    delta_name,
    load_checkpoints,
    newest_generation,
)
from storage_node.entry_index import pack
from storage_node.errors import JournalCorruptError
from storage_node.ledger_state import LedgerState
from storage_node.records import (
    CheckpointRecord,
    DeleteRecord,
    EntryRecord,
    FenceRecord,
    KeyRecord,
    LacRecord,
    LinkRecord,
    decode,
)
from storage_node.segments import (
    Position,
    SegmentScan,
    list_compacted,
    list_segments,
    seal_segment,
    segment_path,
)


@dataclasses.dataclass
class Recovered:
    ledgers: dict[int, LedgerState]
    next_segment: int                     # the first file number not used by a segment or compacted file
    notes: list[str]                      # what start-up had to do, for the log
    # the highest checkpoint generation in the data directory or its journal's CHECKPOINT records, loaded or not
    newest_generation: int = 0
    journal_end: Position | None = None   # the last segment and its size after replay (None: no segment)


def recover(data_dir: pathlib.Path, journal_dir: pathlib.Path) -> Recovered:
    notes: list[str] = []
    segments = list_segments(journal_dir)
    compacted = list_compacted(journal_dir)
    # Numbers are shared with compacted files, so any gap also means compaction has run.
    whole_journal = not compacted and segments == list(range(1, len(segments) + 1))
    start, ledgers, chain = _load_checkpoint(data_dir, segments, whole_journal, notes)
    replay = _Replay(data_dir, ledgers, start, chain, whole_journal, notes)
    for segment in segments:
        if segment < start.segment:
            continue
        path = segment_path(journal_dir, segment)
        offset = start.offset if segment == start.segment else 0
        if path.stat().st_size < offset:
            raise JournalCorruptError(
                f"journal segment {path} is shorter than the checkpoint says ({path.stat().st_size} < {offset} "
                f"bytes): acknowledged records are missing; the node refuses to start. Restore the data "
                f"directory, or decommission this node"
            )
        scan = SegmentScan(path, offset, is_last=segment == segments[-1])
        replay.segment(segment, scan)
        if scan.torn_at is not None:
            dropped = path.stat().st_size - scan.torn_at
            notes.append(f"dropped a torn record at offset {scan.torn_at} of {scan.path} ({scan.torn_reason}) "
                         f"and the rest of the file ({dropped} bytes): the last group, whose write never "
                         f"completed before a crash, so none of it was acknowledged")
        if scan.is_last:
            seal_segment(path, scan.valid_end)
    replayed_at = time.monotonic()
    for state in ledgers.values():
        state.key_durable = True
        state.fence_durable = state.fenced
        state.first_seen = replayed_at      # when each ledger was first seen is not journaled (rule 8's grace)
    end = Position(segments[-1], segment_path(journal_dir, segments[-1]).stat().st_size) if segments else None
    return Recovered(ledgers, max(segments[-1:] + compacted[-1:], default=0) + 1, notes,
                     max(newest_generation(data_dir), chain.generation if chain is not None else 0,
                         replay.newest_generation), end)


def _load_checkpoint(data_dir: pathlib.Path, segments: list[int], whole_journal: bool,
                     notes: list[str]) -> tuple[Position, dict[int, LedgerState], Chain | None]:
    first = Position(segments[0] if segments else 1, 0)
    try:
        loaded = load_checkpoints(data_dir)
    except SnapshotDamaged as exc:
        if not whole_journal:
            raise JournalCorruptError(_without_snapshot(data_dir, f"is damaged ({exc})")) from exc
        notes.append(f"ignored the damaged checkpoint snapshot ({exc}); replaying the whole journal")
        return first, {}, None
    if loaded is None:
        if not whole_journal:
            raise JournalCorruptError(_without_snapshot(data_dir, "is missing"))
        return first, {}, None
    position, ledgers, chain = loaded
    if position.segment not in segments and position.offset > 0:
        raise JournalCorruptError(
            f"the checkpoint covers journal segment {position.segment} of {data_dir / 'journal'} but that "
            f"segment is missing: the journal was damaged or partly deleted; the node refuses to start. "
            f"Restore the data directory, or decommission this node"
        )
    return position, ledgers, chain


def _without_snapshot(data_dir: pathlib.Path, what: str) -> str:
    return (f"the checkpoint snapshot of {data_dir} {what}, and garbage collection already removed older "
            f"journal segments that only the snapshot describes: replaying the rest would forget "
            f"acknowledged entries; the node refuses to start. Restore the data directory, or decommission "
            f"this node")


class _Replay:
    """Applies the records of the segments replayed, in order, onto the ledgers the checkpoint loaded, and checks
    the CHECKPOINT and LINK records among them (module docstring)."""

    def __init__(self, data_dir: pathlib.Path, ledgers: dict[int, LedgerState], start: Position, chain: Chain | None,
                 whole_journal: bool, notes: list[str]):
        """chain: the checkpoint chain loaded (None: the whole journal is replayed from its start); whole_journal:
        no journal file was ever removed, so a CHECKPOINT record newer than the chain loaded is only noted."""
        self.data_dir = data_dir
        self.ledgers = ledgers
        self.start = start
        self.whole_journal = whole_journal
        self.notes = notes
        self.loaded = (chain.generation, chain.deltas) if chain is not None else None
        self.newest_generation = 0            # in the CHECKPOINT records replayed
        self.previous: Position | None = None  # the segment replayed last and where its valid records end

    def segment(self, segment: int, scan: SegmentScan) -> None:
        for record in scan.records():
            self._apply(segment, record.offset, record.length, record.body, scan.path)
        self.previous = Position(segment, scan.valid_end)

    def _apply(self, segment: int, offset: int, length: int, body: memoryview, path: pathlib.Path) -> None:
        ledgers = self.ledgers
        match decode(body):
            case EntryRecord(ledger_id, entry_id, lac):
                state = _known(ledgers, ledger_id, path, offset)
                state.index.put(entry_id, pack(segment, offset), length)
                state.record_entry(entry_id, lac)
            case KeyRecord(ledger_id, master_key):
                if ledger_id not in ledgers:
                    ledgers[ledger_id] = LedgerState(ledger_id, master_key)
            case FenceRecord(ledger_id):
                _known(ledgers, ledger_id, path, offset).fenced = True
            case DeleteRecord(ledger_id):
                # A later add of the same id (a late writer) starts again with its own KEY record.
                ledgers.pop(ledger_id, None)
            case LacRecord(ledger_id, lac):
                _known(ledgers, ledger_id, path, offset).record_lac(lac)
            case CheckpointRecord() as record:
                self._check_checkpoint(record, path, offset)
            case LinkRecord() as link:
                self._check_link(link, path)

    def _check_checkpoint(self, record: CheckpointRecord, path: pathlib.Path, offset: int) -> None:
        self.newest_generation = max(self.newest_generation, record.generation)
        if self.loaded is None or (record.generation, record.number) <= self.loaded:
            return
        if self.whole_journal:   # nothing removed: the older checkpoint and the whole journal restore everything
            self.notes.append(f"journal segment {path} records checkpoint "
                              f"{_checkpoint_name(record.generation, record.number)}, newer than the one loaded "
                              f"({_checkpoint_name(*self.loaded)}); no journal file was ever removed, so the replay "
                              f"from the one loaded restores everything")
            return
        raise JournalCorruptError(
            f"journal segment {path} offset {offset} records checkpoint "
            f"{_checkpoint_name(record.generation, record.number)} of "
            f"{self.data_dir} (covering segment {record.segment} offset {record.offset}), newer than the one "
            f"loaded ({_checkpoint_name(*self.loaded)}): its files were deleted or older copies restored, and "
            f"compaction may have removed journal files only they describe, so replaying from the older one could "
            f"forget acknowledged entries; the node refuses to start. Restore the data directory, or decommission "
            f"this node"
        )

    def _check_link(self, link: LinkRecord, path: pathlib.Path) -> None:
        if link.previous_segment < self.start.segment:
            return      # it follows a segment the checkpoint covers whole: compaction may have removed that one
        previous = self.previous
        if (previous is not None and previous.segment == link.previous_segment
                and previous.offset >= link.previous_end):
            return
        replayed = ("none" if previous is None else
                    f"segment {previous.segment}, whose valid records end at offset {previous.offset}")
        raise JournalCorruptError(
            f"journal segment {path} was started after segment {link.previous_segment} ended at offset "
            f"{link.previous_end}, but the segment replayed before it is {replayed}: a journal segment was deleted "
            f"or cut short (or the checkpoint files that covered it were lost), so replaying the rest would forget "
            f"acknowledged entries; the node refuses to start. Restore the data directory, or decommission this "
            f"node"
        )


def _checkpoint_name(generation: int, number: int) -> str:
    """The file a checkpoint is kept in, as a message names it."""
    return delta_name(generation, number) if number else f"{SNAPSHOT_NAME} of generation {generation}"


def _known(ledgers: dict[int, LedgerState], ledger_id: int, path: pathlib.Path, offset: int) -> LedgerState:
    state = ledgers.get(ledger_id)
    if state is None:
        raise JournalCorruptError(
            f"journal segment {path} offset {offset} has a record of ledger {ledger_id} before its master "
            f"key record: the journal is inconsistent; the node refuses to start. Restore the data "
            f"directory, or decommission this node"
        )
    return state
