"""The node's storage: ledger states, entry index and journal behind the operations of the protocol.

Runs on the event loop thread; only fsyncs, snapshot writes and start-up replay go to worker threads.
Every answer follows rule 8: NO_LEDGER / NO_ENTRY only when the node has no record of it at all,
ERROR for anything it cannot vouch for.
"""
from __future__ import annotations

import asyncio
import dataclasses
import errno
import itertools
import logging
import shutil
import time
from array import array
from typing import TYPE_CHECKING, Callable, Collection, Iterable, Iterator, NamedTuple

from metadata.model import HEALTH_OK
from protos import ledger_pb2 as pb
from protos.digest import entry_digest
from protos.limits import MAX_WAIT_LAC_MS
from storage_node.checkpoint import Chain, encode_delta, encode_snapshot, save_delta, save_snapshot
from storage_node.compaction import copy_records, moves_out_of, plan_compaction
from storage_node.config import NodeConfig
from storage_node.disk_usage import DataDirUsage
from storage_node.entry_index import LiveBytes, pack, unpack
from storage_node.errors import JournalWriteError, UncopyableRecordError
from storage_node.file_modes import private_directory
from storage_node.journal import DISK_FULL_ERRNOS, Group, Journal
from storage_node.ledger_state import LedgerState, Refusal, Verdict
from storage_node.metrics import NodeMetrics
from storage_node.records import (
    ENTRY_PAYLOAD_OFFSET,
    CheckpointRecord,
    decode_entry_frame,
    encode_checkpoint,
    encode_delete,
    encode_entry_head,
    encode_fence,
    encode_key,
    encode_lac,
)
from storage_node.replay import recover
from storage_node.segments import (
    JOURNAL_DIR,
    FileNumbers,
    SegmentReaders,
    data_file_path,
    fsync_directory,
    list_compacted,
    list_segments,
    read_record,
)

if TYPE_CHECKING:
    from storage_node.key_check import KeyCheck

MAX_ID = 1 << 62                 # ids beyond this are absurd: BAD_REQUEST
MAX_KEY_BYTES = 64     # clients send 32 (protos/digest.py master_key); each ledger's is kept in memory
MAX_DELTAS = 4096                # checkpoint deltas after a base at most (checkpoint.py): 68 hours at 60 s
_KNOWN_FLAGS = pb.RECOVERY_ADD

_log = logging.getLogger(__name__)


class AddResult(NamedTuple):
    """The answer to one entry of an AddRequest; OK holds only once the entry's group is durable."""

    ledger_id: int
    entry_id: int
    status: int                 # ledger.proto Status
    message: str


class AddRun(NamedTuple):
    """The same answer for the entries first_entry_id..last_entry_id of a ledger, which came one after
    another in the request with consecutive ids (ledger.proto AddRange): exactly what one AddResult per
    entry would say. OK holds only once the entries' group is durable."""

    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    status: int                 # ledger.proto Status
    message: str

    def results(self) -> Iterator[AddResult]:
        """The run as one AddResult per entry, in order."""
        for entry_id in range(self.first_entry_id, self.last_entry_id + 1):
            yield AddResult(self.ledger_id, entry_id, self.status, self.message)


def runs_of(entries, status: int, message: str) -> list[AddRun]:
    """The same answer for every entry of a request, as runs."""
    return _joined([AddRun(e.ledger_id, e.entry_id, e.entry_id, status, message) for e in entries])


class ReadResult(NamedTuple):
    status: int                 # ledger.proto Status
    message: str
    lac: int = -1               # the LAC the entry carried (piggybacked); the rest only when status is OK
    payload: bytes | memoryview = b""
    digest: int = 0


class LacAnswer(NamedTuple):
    status: int                 # ledger.proto Status
    message: str
    last_entry_id: int = -1     # the highest entry stored; the LAC fields only when status is OK
    lac: int = -1               # the highest LAC seen


# The key check's verdicts for ledgers new to the node, by (ledger id, master key): storage_node/key_check.py.
FirstSight = dict[tuple[int, bytes], Verdict]


# What a journal group applies once it is durable (Storage._apply, in journal order: rule 5): a run of
# entries, or one other record (a CHECKPOINT record is its own pending item).
class PendingRun:
    """ENTRY records of one ledger with consecutive ids, first_entry_id onwards, one after another in the
    group from `rel` (their frames' offset from the start of the group) on: an OK AddRun once durable."""

    __slots__ = ("state", "first_entry_id", "rel", "lengths", "lac")

    def __init__(self, state: LedgerState, first_entry_id: int, rel: int):
        self.state = state
        self.first_entry_id = first_entry_id
        self.rel = rel
        self.lengths: list[int] = []    # of each whole frame, in entry order
        self.lac = -1                   # the highest piggybacked LAC the entries carry

    @property
    def last_entry_id(self) -> int:
        return self.first_entry_id + len(self.lengths) - 1


class PendingKey(NamedTuple):
    state: LedgerState


class PendingFence(NamedTuple):
    state: LedgerState


class PendingLac(NamedTuple):
    state: LedgerState
    lac: int


def _joined(answers: list) -> list[AddRun]:
    """add_runs' answers (PendingRun: OK once durable, or AddRun: a refusal), in order, as AddRuns; neighbours
    that say the same of consecutive ids of one ledger are joined."""
    runs: list[AddRun] = []
    for answer in answers:
        if type(answer) is PendingRun:
            answer = AddRun(answer.state.ledger_id, answer.first_entry_id, answer.last_entry_id, pb.OK, "")
        last = runs[-1] if runs else None
        if (last is not None and answer.first_entry_id == last.last_entry_id + 1 and answer.ledger_id == last.ledger_id
                and answer.status == last.status and answer.message == last.message):
            runs[-1] = last._replace(last_entry_id=answer.last_entry_id)
        else:
            runs.append(answer)
    return runs


def id_problem(ledger_id: int, entry_id: int = 0) -> str:
    """Why a request's ids are absurd (BAD_REQUEST), or "" when they are in range."""
    if not 0 <= ledger_id < MAX_ID:
        return f"ledger id {ledger_id} is out of range [0, {MAX_ID})"
    if not 0 <= entry_id < MAX_ID:
        return f"entry id {entry_id} is out of range [0, {MAX_ID})"
    return ""


@dataclasses.dataclass(frozen=True)
class CompactionResult:
    rewritten: tuple[int, ...]       # files whose live records were copied
    deleted: tuple[int, ...]         # files removed
    copied_bytes: int
    reclaimed_bytes: int


class Storage:
    def __init__(self, config: NodeConfig, metrics: NodeMetrics | None = None):
        self.config = config
        self.data_dir = config.data_dir
        self.journal_dir = config.data_dir / JOURNAL_DIR
        self.metrics = metrics or NodeMetrics()
        self.ledgers: dict[int, LedgerState] = {}
        # The live bytes per file over the indexes of every ledger in self.ledgers, and who holds records where
        # (compaction's plan): a ledger's index is counted from when it joins self.ledgers until it leaves.
        self._live = LiveBytes()
        self.ready = False
        # Why the node is read-only, by source (startup flag, disk, operator flag); read_only_reason joins
        # them, kept as a plain string because every add checks it.
        self._read_only: dict[str, str] = {}
        self.read_only_reason = ""
        if config.read_only:
            self.set_read_only("startup", "started with --read-only (drained)")
        self.journal: Journal | None = None
        self._numbers: FileNumbers | None = None
        self.files: DataDirUsage | None = None      # what the data directory takes, for the disk watch and metrics
        self._readers = SegmentReaders(self.journal_dir)
        self._lac_waiters: dict[int, set[asyncio.Future]] = {}
        self._lac_waiting = 0           # WaitLac calls waiting, over every ledger (--max-lac-waiters)
        self._checkpoint_lock = asyncio.Lock()
        self._compaction_lock = asyncio.Lock()
        # What the last snapshot written covers: the count of durable journal records that change what a snapshot
        # holds (all but CHECKPOINT records) and the count of changes made to it without a journal record
        # (compaction's index moves, a read-only node's LACs) when it was encoded. Every other change is applied from
        # a durable journal record, so a snapshot of the same two would hold the same acknowledged state. (Not the
        # durable position: a checkpoint's own CHECKPOINT record moves it, and an idle node would write a checkpoint
        # and a record every interval.)
        self._state_records = 0
        self._unjournaled_changes = 0
        self._snapshot_covers: tuple[int, int] | None = None
        # The newest checkpoint this process saved, and the newest whose CHECKPOINT record is durable: compaction
        # deletes files only while they are the same (compact()).
        self._checkpointed: CheckpointRecord | None = None
        self._recorded: CheckpointRecord | None = None
        # What the next checkpoint delta holds (checkpoint.py): the ledgers changed and dropped since the last
        # checkpoint. Every change to what a checkpoint holds marks its ledger through _changed_state (or
        # delete_ledgers). The first checkpoint after start-up is whole (replay's changes are not marked), as is
        # the next one after a checkpoint that failed (its changes are marked in no set any more).
        self._changed: set[int] = set()
        self._dropped: set[int] = set()
        self._chain: Chain | None = None   # the checkpoints this process wrote (None: none yet)
        self._newest_generation = 0     # the highest generation on disk: a new base takes the next one
        self._whole_next = True
        self._uncopyable: set[int] = set()   # files with a record compaction could not read: never copied again
        # Ledgers whose over-replicated copies garbage collection is dropping: every add to them is refused until
        # the drop ends (storage_node/gc.py drop_overreplicated says why).
        self._dropping: set[int] = set()
        # The gauges' counts of what the node holds (its metrics), kept as it changes: a walk over every ledger
        # each second would cost what the node holds.
        self._entries = 0               # entries: the sum of the ledgers' index counts
        self._fenced = 0                # fenced ledgers
        self.enospc_free_bytes: int | None = None   # free space when a journal write last failed with ENOSPC
        # Rule 7 at first sight (storage_node/key_check.py): what a key must pass before it is bound to a ledger new
        # to the node, set by the node once its ZooKeeper session is open; None binds the first key unchecked
        # (--bind-keys-unchecked, and tests of the storage alone).
        self.key_check: KeyCheck | None = None
        self.on_change: Callable[[], None] = lambda: None   # the node republishes (read-only or broken now)

    # -- life cycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        """Replay the journal (in a worker thread: requests meanwhile answer ERROR), then take writes."""
        private_directory(self.journal_dir)
        loop = asyncio.get_running_loop()
        recovered = await loop.run_in_executor(None, recover, self.data_dir, self.journal_dir)
        for note in recovered.notes:
            _log.warning("%s", note)
        self.ledgers = recovered.ledgers
        for state in self.ledgers.values():
            self._live.attach(state.index, state)
        self._entries = sum(state.index.count for state in self.ledgers.values())
        self._fenced = sum(1 for state in self.ledgers.values() if state.fenced)
        self._newest_generation = recovered.newest_generation
        self._numbers = FileNumbers(recovered.next_segment)
        self.files = DataDirUsage(self.data_dir, self.journal_dir, self._numbers)
        self.journal = Journal(
            self.journal_dir, self._numbers, self.config.journal_segment_bytes,
            apply=self._apply, on_write_error=self._on_write_error,
            page_cache_bytes=self.config.journal_page_cache_bytes, previous=recovered.journal_end,
        )
        if self.journal.full_at_start is not None:
            _log.warning("%s", self.journal.full_at_start)
            self._on_write_error(self.journal.full_at_start)   # read-only until the disk watch sees space again
        self.ready = True

    async def checkpoint(self, only_if_changed: bool = False) -> bool:
        """Checkpoint the index at the durable position; whether it wrote one (only_if_changed: not when the last
        one written covers the same state, as on an idle node). A delta of what changed since the last one, or
        a whole snapshot when the deltas since the last whole one add up to its size (checkpoint.py). Refused
        (JournalWriteError) once the journal broke: the disk is not trusted any more, and compaction must then
        not delete the files it copied. Once its file is in place, its CHECKPOINT record is journaled and waited for
        (replay then refuses to start from an older one, storage_node/replay.py); not at close, where the journal
        is closed already: nothing is deleted on the strength of that one."""
        async with self._checkpoint_lock:
            return await self._checkpoint(only_if_changed)

    async def _checkpoint(self, only_if_changed: bool) -> bool:
        """checkpoint(), with the checkpoint lock held."""
        if self.broken:
            raise JournalWriteError(f"no checkpoint: {self.broken}")
        covers = (self._state_records, self._unjournaled_changes)
        if only_if_changed and covers == self._snapshot_covers:
            return False
        position = self.journal.durable
        # Encoded (copied) on the loop thread, so it matches the durable position exactly; framed and written
        # in a worker thread.
        chain = self._chain
        if (self._whole_next or chain is None or chain.deltas >= MAX_DELTAS
                or chain.delta_bytes >= chain.base_bytes):
            generation = self._newest_generation + 1
            encoded = encode_snapshot(position, self.ledgers, generation)
            checkpointed, save = list(self.ledgers.values()), save_snapshot
            after = Chain(generation, 0, encoded.size, 0)
        else:
            checkpointed = [state for ledger_id in self._changed
                            if (state := self.ledgers.get(ledger_id)) is not None]
            encoded = encode_delta(position, chain.generation, chain.deltas + 1, checkpointed, self._dropped)
            save = save_delta
            after = dataclasses.replace(chain, deltas=chain.deltas + 1,
                                        delta_bytes=chain.delta_bytes + encoded.size)
        for state in checkpointed:
            state.index.mark_checkpointed()
        saved = CheckpointRecord(after.generation, after.deltas, position.segment, position.offset)
        self._changed.clear()
        self._dropped.clear()
        self._whole_next = True        # until this one is in place: if it fails, no delta holds its changes
        self._newest_generation = max(self._newest_generation, after.generation)   # on disk, even if it fails
        saving = asyncio.get_running_loop().run_in_executor(None, save, self.data_dir, encoded)
        try:
            await asyncio.shield(saving)
        except asyncio.CancelledError:
            # A cancelled wait (the node stopping its garbage collector) does not stop the worker thread: the
            # lock is held until it is done, so that the next checkpoint (close()'s) cannot write the same
            # temporary file beside it and a half-written one never replaces a good snapshot.
            await asyncio.wait([saving])
            if not saving.cancelled() and saving.exception() is None:
                self._saved(after, covers, saved)
            raise
        self._saved(after, covers, saved)
        await self._record_checkpoint()
        return True

    def _saved(self, after: Chain, covers: tuple[int, int], saved: CheckpointRecord) -> None:
        self._whole_next = False
        self._chain = after
        self._snapshot_covers = covers
        self._checkpointed = saved

    async def _record_checkpoint(self) -> JournalWriteError | None:
        """Journal the CHECKPOINT record of the newest checkpoint saved and wait until it is durable (the caller holds
        the checkpoint lock); None once it is, else why not. It lies after the position that checkpoint covers."""
        try:
            group = self.journal.group
        except JournalWriteError as exc:
            return exc
        self.journal.append(group, encode_checkpoint(self._checkpointed))
        group.items.append(self._checkpointed)     # _apply: the record is durable
        return await group.outcome()

    async def close(self) -> None:
        if self.journal is None:
            return
        await self.journal.close()
        if not self.broken:      # a broken journal's disk is not trusted: the restart replays what it holds
            await self.checkpoint()
        self._readers.close()
        self.ready = False

    @property
    def broken(self) -> str:
        """Why the journal broke (a failed fsync, roll or apply; rule 5), "" while it works. A broken node
        serves nothing until it is restarted: see refusal()."""
        journal = self.journal
        return (journal.broken or "") if journal is not None else ""

    @property
    def health(self) -> str:
        """What the node registers as its health: "ok", or "broken: <why>"."""
        broken = self.broken
        return f"broken: {broken}" if broken else HEALTH_OK

    def refusal(self) -> str:
        """Why every request that reads or changes the node's state is answered ERROR now, "" while it serves.

        A node whose journal broke refuses them all until restarted: after a failed fsync what is on disk
        is unknown, so it acknowledges nothing more and answers no read, LAC or fence from a state the disk
        may not hold (a client counts ERROR as a node failure: a writer changes ensemble, a reader and a
        recovery go to another replica, and it is never a negative, rule 8)."""
        broken = self.broken
        if broken:
            return f"node {self.config.node_id} refuses to serve until it is restarted: {broken}"
        if not self.ready:
            return f"node {self.config.node_id} is not ready (starting up or shutting down); retry"
        return ""

    def set_read_only(self, source: str, reason: str) -> None:
        """Turn one source of read-only mode on (a reason) or off (""); the node is writable without any."""
        if reason:
            self._read_only[source] = reason
        else:
            self._read_only.pop(source, None)
        self.read_only_reason = "; ".join(self._read_only.values())

    def is_read_only_because(self, source: str) -> bool:
        return source in self._read_only

    # -- adds -----------------------------------------------------------------------------------

    def add_batch(self, entries, first_sight: FirstSight | None = None) -> tuple[list[AddResult], Group | None]:
        """add_runs with one AddResult per entry."""
        runs, group = self.add_runs(entries, first_sight)
        return [result for run in runs for result in run.results()], group

    def add_runs(self, entries, first_sight: FirstSight | None = None) -> tuple[list[AddRun], Group | None]:
        """Check and journal a batch; returns the answers in entry order as runs, and the group to await
        (None when nothing was journaled). OK runs hold only once that group is durable. first_sight: the key
        check's verdicts (first_sight_verdicts) for the entries' ledgers that the node does not hold; with a key
        check on, an entry of such a ledger without one is refused ERROR, never bound unchecked.

        Every entry is checked and journaled on its own (one ENTRY record each), but what a batch shares is
        done once per run of entries of one ledger, with one key and flags, and consecutive ids: the ledger,
        key, fence and read-only checks, the answer (one AddRun) and, once durable, the index update."""
        try:
            group = self.journal.group
        except JournalWriteError as exc:
            return runs_of(entries, pb.ERROR, str(exc)), None
        answers: list = []              # PendingRun (OK once durable) or AddRun (a refusal), in entry order
        chunks: list = []               # the records' bytes, appended to the group at the end
        pending: list = []              # what the group applies once durable, for those records
        base = group.size               # where this batch's records start in the group
        size = 0
        # The ledger, key and flags of the entries journaled last: the next entry with the same ones needs
        # none of the checks that depend only on them (they cannot change while the batch is checked).
        ledger_now = key_now = flags_now = state = None
        run = None                      # the run the next entry extends if its id is next_id
        next_id = lengths = None
        max_entry_bytes = self.config.max_entry_bytes
        try:
            for e in entries:
                ledger_id = e.ledger_id
                entry_id = e.entry_id
                lac = e.last_add_confirmed
                payload = e.payload
                key = e.master_key
                flags = e.flags
                digest = e.digest
                known = ledger_id == ledger_now and flags == flags_now and key == key_now
                # _entry_problem's checks, at once (those of the ledger id, key and flags passed already for
                # a known entry); it says which one failed.
                if not ((known or (0 <= ledger_id < MAX_ID and 0 < len(key) <= MAX_KEY_BYTES
                                   and not flags & ~_KNOWN_FLAGS))
                        and -1 <= lac < entry_id < MAX_ID and len(payload) <= max_entry_bytes
                        and entry_digest(ledger_id, entry_id, lac, payload) == digest):
                    status, problem = self._entry_problem(ledger_id, entry_id, lac, key, flags, payload, digest)
                    if problem:
                        answers.append(AddRun(ledger_id, entry_id, entry_id, status, problem))
                        run = None
                        continue
                if not known:
                    refusal = self._add_refusal(ledger_id, key, flags, first_sight)
                    if refusal:
                        answers.append(AddRun(ledger_id, entry_id, entry_id, *refusal))
                        run = None
                        continue
                    state = self.ledgers[ledger_id]
                    ledger_now, key_now, flags_now = ledger_id, key, flags
                    run = None
                    if not state.key_durable:
                        key_record = self._key_record(group, state)
                        if key_record is not None:
                            chunks.append(key_record)
                            pending.append(PendingKey(state))
                            size += len(key_record)
                head = encode_entry_head(ledger_id, entry_id, lac, flags, digest, payload)
                length = len(head) + len(payload)
                if run is None or entry_id != next_id:
                    run = PendingRun(state, entry_id, base + size)
                    lengths = run.lengths
                    answers.append(run)
                    pending.append(run)
                chunks.append(head)
                chunks.append(payload)
                lengths.append(length)
                if lac > run.lac:
                    run.lac = lac
                size += length
                next_id = entry_id + 1
        finally:
            # Whatever was journaled goes into the group with what applies it (also after a bug raised
            # mid-batch: the service then answers ERROR, which claims nothing).
            if chunks:
                records = sum(len(p.lengths) if type(p) is PendingRun else 1 for p in pending)
                self.journal.append_many(group, chunks, size, records)
                group.items.extend(pending)
        return _joined(answers), group if chunks else None

    def _add_refusal(self, ledger_id: int, key: bytes, flags: int, first_sight: FirstSight | None) -> Refusal | None:
        """Why adds of this ledger with this key and flags are refused (its over-replicated copies being dropped,
        read-only, rules 6 and 7), or None; creates the ledger on its first add, once the key check passed it."""
        recovery = flags & pb.RECOVERY_ADD
        if self._dropping and ledger_id in self._dropping:   # a drop in progress (rare): no lookup per add otherwise
            return Refusal(pb.ERROR, f"node {self.config.node_id} is dropping its copies of ledger {ledger_id}, whose "
                                     "metadata names it nowhere; write to another node, or retry")
        if self.read_only_reason and not recovery:
            return Refusal(pb.READ_ONLY, self._read_only_message())
        state = self.ledgers.get(ledger_id)
        if state is None:
            if self.key_check is not None:
                checked, pair = first_sight or {}, (ledger_id, bytes(key))
                if pair not in checked:
                    return Refusal(pb.ERROR, f"node {self.config.node_id} has not checked the master key of ledger "
                                             f"{ledger_id}, new to it, against the ledger's metadata; retry")
                if checked[pair]:
                    return checked[pair]
            self._create(ledger_id, key)
            return None
        return state.check_add(key, recovery)

    # -- first sight: rule 7's key check (storage_node/key_check.py) ---------------------------------

    def new_ledger_entries(self, entries, waiting: Collection[int] = ()) -> tuple[list, list] | None:
        """With a key check on and some of entries' ledgers new to the node, or among `waiting` (those of which a
        part of the stream is set aside still: their entries wait behind it, so that a ledger's entries are
        journaled in the order the stream sent them): (the entries of the other ledgers, those of these). None
        otherwise (the common case): add_runs takes them all at once. The service journals the first part at once
        and the second once first_sight_verdicts answered, so that adds of the ledgers a node holds never wait for
        ZooKeeper, even on an Add stream that a client shares between ledgers."""
        ledgers = self.ledgers
        if self.key_check is None:
            return None
        ids = {e.ledger_id for e in entries}
        if ids <= ledgers.keys() and (not waiting or ids.isdisjoint(waiting)):
            return None
        held, new = [], []
        for e in entries:
            (held if e.ledger_id in ledgers and e.ledger_id not in waiting else new).append(e)
        return held, new

    async def first_sight_verdicts(self, entries) -> FirstSight:
        """The key check's verdict for each (ledger id, key) of entries whose ledger the node does not hold, all
        asked at once, for add_runs. Malformed ids and keys are not asked about: add_runs refuses them as
        BAD_REQUEST before it needs a verdict."""
        pairs = list({(e.ledger_id, bytes(e.master_key)) for e in entries
                      if e.ledger_id not in self.ledgers and not id_problem(e.ledger_id)
                      and 0 < len(e.master_key) <= MAX_KEY_BYTES})
        found = await asyncio.gather(*(self.key_check.verdict(*pair) for pair in pairs))
        return dict(zip(pairs, found))

    async def _first_sight(self, ledger_id: int, key: bytes) -> Verdict:
        """None when key may be bound to ledger_id, which the node does not hold (always, without a key check)."""
        return None if self.key_check is None else await self.key_check.verdict(ledger_id, key)

    def _entry_problem(self, ledger_id: int, entry_id: int, lac: int, key: bytes, flags: int,
                       payload: bytes, digest: int) -> tuple[int, str]:
        """(status, why) of an add's entry that cannot be taken, or (OK, "") when it can: BAD_REQUEST when it is
        malformed or damaged; TOO_LARGE when it is well formed and over --max-entry-bytes (the writer may send
        it to no node with this limit, and a writer treats it as its own error, not this node's failure)."""
        problem = id_problem(ledger_id, entry_id)
        if not problem and not -1 <= lac < entry_id:
            problem = f"piggybacked LAC {lac} of entry {entry_id} must be in [-1, entry id)"
        if not problem and (not key or len(key) > MAX_KEY_BYTES):
            problem = f"master key must be 1..{MAX_KEY_BYTES} bytes, got {len(key)}"
        if not problem and flags & ~_KNOWN_FLAGS:
            problem = f"unknown add flags {flags:#x}"
        if problem:
            return pb.BAD_REQUEST, problem
        if len(payload) > self.config.max_entry_bytes:
            return pb.TOO_LARGE, (f"entry of {len(payload)} bytes exceeds this node's limit of "
                                  f"{self.config.max_entry_bytes} bytes (--max-entry-bytes): split it")
        if entry_digest(ledger_id, entry_id, lac, payload) != digest:
            return pb.BAD_REQUEST, (f"digest mismatch on entry {ledger_id}/{entry_id}: damaged in transit or "
                                    "computed wrongly")
        return pb.OK, ""

    def _read_only_message(self) -> str:
        return f"node {self.config.node_id} is read-only ({self.read_only_reason}); write to other nodes"

    def _create(self, ledger_id: int, key: bytes) -> LedgerState:
        state = self.ledgers[ledger_id] = LedgerState(ledger_id, bytes(key))
        self._live.attach(state.index, state)
        self._changed.add(ledger_id)
        return state

    def _changed_state(self, state: LedgerState) -> None:
        """What a checkpoint holds of this ledger changed: the next delta holds it."""
        self._changed.add(state.ledger_id)

    def _journal_key(self, group: Group, state: LedgerState) -> None:
        record = self._key_record(group, state)
        if record is not None:
            self.journal.append(group, record)
            group.items.append(PendingKey(state))

    @staticmethod
    def _key_record(group: Group, state: LedgerState) -> bytes | None:
        """The ledger's KEY record for group to carry, or None while a group on its way carries it: once per
        ledger, again only if the group that carried it failed (then key_group is reset). The caller
        journals it (before the ledger's other records: replay needs the key first) with its PendingKey."""
        if state.key_group is not None and not state.key_group.done.done():
            return None
        state.key_group = group
        return encode_key(state.ledger_id, state.master_key)

    def _journal_record(self, ledger_id: int, key: bytes, state: LedgerState | None, record: bytes, pending,
                        *fields) -> tuple[Group, LedgerState]:
        """Journal one record of a ledger into the open group (raises JournalWriteError when the journal takes
        no writes), creating the ledger if it is new and after its KEY record while that is not durable
        (replay needs a ledger's key before its other records); `pending(state, *fields)` is applied once the
        group is durable. Returns the group and the ledger's state."""
        group = self.journal.group
        if state is None:
            state = self._create(ledger_id, key)
        if not state.key_durable:
            self._journal_key(group, state)
        self.journal.append(group, record)
        group.items.append(pending(state, *fields))
        return group, state

    @staticmethod
    async def _durable(group: Group, what: str) -> Verdict:
        """None once group is durable; ERROR naming `what` when its write or fsync failed (rule 5)."""
        error = await group.outcome()
        if error is not None:
            return Refusal(pb.ERROR, f"{what} is not durable: {error}")
        return None

    def _apply(self, segment: int, base: int, group: Group, fsync_seconds: float) -> None:
        """The group is durable: make it visible, in journal order (rule 5)."""
        origin = pack(segment, base)
        advanced = []
        entries = stored = 0
        state_records = group.records
        for item in group.items:
            kind = type(item)
            if kind is PendingRun:
                state, lengths = item.state, item.lengths
                # The run's frames lie one after another: their locations are running sums of their lengths.
                locations = array("q", itertools.accumulate(lengths, initial=origin + item.rel))
                locations.pop()
                held = state.index.count
                state.index.put_run(item.first_entry_id, locations, lengths)
                if self.ledgers.get(state.ledger_id) is state:     # not dropped since (garbage collection)
                    self._entries += state.index.count - held
                self._changed_state(state)
                entries += len(lengths)
                stored += sum(lengths)
                if state.record_entry(item.last_entry_id, item.lac):
                    advanced.append(state.ledger_id)
            elif kind is PendingKey:
                item.state.key_durable, item.state.key_group = True, None
            elif kind is PendingFence:
                item.state.fence_durable, item.state.fence_group = True, None
            elif kind is CheckpointRecord:
                self._recorded = item
                state_records -= 1
            elif item.state.record_lac(item.lac):
                self._changed_state(item.state)
                advanced.append(item.state.ledger_id)
        self._state_records += state_records
        self.metrics.group_synced(entries, stored - entries * ENTRY_PAYLOAD_OFFSET, fsync_seconds,
                                  time.perf_counter() - group.started)
        self._wake_lac_waiters(advanced)

    def _wake_lac_waiters(self, ledger_ids: list[int]) -> None:
        if self._lac_waiters:
            for ledger_id in ledger_ids:
                for waiter in self._lac_waiters.pop(ledger_id, ()):
                    if not waiter.done():
                        waiter.set_result(None)

    def _lac_while_read_only(self, state: LedgerState | None, lac: int) -> Verdict:
        """A read-only node takes the LAC of a ledger it holds, in memory: it describes entries that are
        stored already, and tailing readers and recovery start from it (rule 17). Not journaled (the disk
        may be full): the next checkpoint keeps it if it can; after a crash before that, the node knows the LAC
        its entries carried, a lower bound, as a LAC is."""
        if state is None:
            return Refusal(pb.READ_ONLY, self._read_only_message())
        if state.record_lac(lac):
            self._unjournaled_changes += 1      # kept by the next periodic checkpoint
            self._changed_state(state)
            self._wake_lac_waiters([state.ledger_id])
        return None

    def _on_write_error(self, exc: JournalWriteError) -> None:
        cause = exc.__cause__
        if isinstance(cause, OSError) and cause.errno in DISK_FULL_ERRNOS:
            try:
                self.enospc_free_bytes = shutil.disk_usage(self.data_dir).free
            except OSError:
                self.enospc_free_bytes = 0
            self.set_read_only("enospc", f"the disk is full (a journal write failed with "
                                         f"{errno.errorcode.get(cause.errno, cause.errno)})")
        self.on_change()

    # -- fencing and LAC --------------------------------------------------------------------------

    async def fence(self, ledger_id: int, key: bytes) -> Verdict:
        """Rule 6: durable before answering; a fence of an unknown ledger creates it fenced (once the first-sight
        key check admitted its key, with a check on)."""
        if not key or len(key) > MAX_KEY_BYTES:
            return Refusal(pb.BAD_REQUEST, f"a fence needs the ledger's master key (1..{MAX_KEY_BYTES} bytes, "
                                           f"got {len(key)})")
        if id_problem(ledger_id):
            return Refusal(pb.BAD_REQUEST, id_problem(ledger_id))
        what = f"fence of ledger {ledger_id}"
        state = self.ledgers.get(ledger_id)
        if state is None:
            verdict = await self._first_sight(ledger_id, key)
            if verdict:
                return verdict      # a refused fence fences nothing (rule 7)
            state = self.ledgers.get(ledger_id)     # bound by another request while the check waited
        if state is not None:
            verdict = state.check_fence(key)
            if verdict or state.fence_durable:
                return verdict
            if state.fence_group is not None and not state.fence_group.done.done():
                return await self._durable(state.fence_group, what)     # its FENCE record is on the way
        try:
            group, state = self._journal_record(ledger_id, key, state, encode_fence(ledger_id), PendingFence)
        except JournalWriteError as exc:
            return Refusal(pb.ERROR, f"cannot fence ledger {ledger_id}: {exc}")
        self._fenced += not state.fenced
        state.fenced = True          # from now on adds are refused, though the fence is not durable yet
        self._changed_state(state)
        state.fence_group = group
        return await self._durable(group, what)

    def last_confirmed(self, ledger_id: int) -> LacAnswer:
        state = self.ledgers.get(ledger_id)
        if state is None:
            return LacAnswer(pb.NO_LEDGER, f"node {self.config.node_id} has no record of ledger {ledger_id}")
        return LacAnswer(pb.OK, "", state.last_entry_id, state.last_add_confirmed)

    async def write_lac(self, ledger_id: int, key: bytes, lac: int) -> Verdict:
        if id_problem(ledger_id) or not -1 <= lac < MAX_ID or not key or len(key) > MAX_KEY_BYTES:
            return Refusal(pb.BAD_REQUEST, f"WriteLac needs a ledger id in [0, {MAX_ID}), a LAC in [-1, {MAX_ID}) "
                                           f"and the master key (1..{MAX_KEY_BYTES} bytes)")
        state = self.ledgers.get(ledger_id)
        if state is None and not self.read_only_reason:     # a read-only node takes no LAC of a ledger new to it
            verdict = await self._first_sight(ledger_id, key)
            if verdict:
                return verdict
            state = self.ledgers.get(ledger_id)     # bound by another request while the check waited
        if state is not None:
            verdict = state.check_write_lac(key)
            if verdict:
                return verdict
        if self.read_only_reason:
            return self._lac_while_read_only(state, lac)
        try:
            group, _ = self._journal_record(ledger_id, key, state, encode_lac(ledger_id, lac), PendingLac, lac)
        except JournalWriteError as exc:
            return Refusal(pb.ERROR, f"cannot write the LAC of ledger {ledger_id}: {exc}")
        return await self._durable(group, f"LAC of ledger {ledger_id}")

    async def wait_lac(self, ledger_id: int, previous_lac: int, timeout_ms: int) -> LacAnswer:
        """Long poll: answer once the LAC passes previous_lac, or at the timeout with what there is."""
        if not 0 <= timeout_ms <= MAX_WAIT_LAC_MS:
            return LacAnswer(pb.BAD_REQUEST, f"timeout_ms must be 0..{MAX_WAIT_LAC_MS}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            state = self.ledgers.get(ledger_id)
            remaining = deadline - loop.time()
            if (state is not None and state.last_add_confirmed > previous_lac) or remaining <= 0:
                return self.last_confirmed(ledger_id)
            if self._lac_waiting >= self.config.max_lac_waiters:
                # --max-lac-waiters wait already: answered at once with what the node knows (a long poll may end
                # early), which the client takes as no news and asks again later; an ERROR was that node's failure.
                return self.last_confirmed(ledger_id)
            waiter = loop.create_future()
            waiters = self._lac_waiters.setdefault(ledger_id, set())
            waiters.add(waiter)
            self._lac_waiting += 1
            try:
                await asyncio.wait_for(waiter, remaining)
            except asyncio.TimeoutError:
                pass
            finally:
                self._lac_waiting -= 1
                waiters.discard(waiter)
                if not waiters and self._lac_waiters.get(ledger_id) is waiters:
                    del self._lac_waiters[ledger_id]

    # -- reads ----------------------------------------------------------------------------------

    def read_entry(self, ledger_id: int, entry_id: int) -> ReadResult:
        state = self.ledgers.get(ledger_id)
        if state is None:
            return ReadResult(pb.NO_LEDGER, f"node {self.config.node_id} has no record of ledger {ledger_id}")
        found = state.index.get(entry_id)
        if found is None:
            return ReadResult(pb.NO_ENTRY, f"node {self.config.node_id} never stored entry {ledger_id}/{entry_id}")
        return self._read_stored(ledger_id, entry_id, *found)

    def read_range(self, ledger_id: int, first: int, last: int) -> Iterator[tuple[int, ReadResult]]:
        """(entry id, result) for every entry stored in [first, last]; the caller checks the ledger exists."""
        index = self.ledgers[ledger_id].index
        for entry_id in index.entries_between(first, last):
            found = index.get(entry_id)
            if found is not None:
                yield entry_id, self._read_stored(ledger_id, entry_id, *found)

    def _read_stored(self, ledger_id: int, entry_id: int, location: int, length: int) -> ReadResult:
        """The index says the entry is here: anything but an intact copy is ERROR, never NO_ENTRY (rule 8)."""
        segment, offset = unpack(location)
        try:
            data = read_record(self._readers.fd(segment), offset, length)
            head = decode_entry_frame(data)
            if (head.ledger_id, head.entry_id) != (ledger_id, entry_id):
                raise ValueError(f"the record there is ENTRY {head.ledger_id}/{head.entry_id}")
        except (OSError, ValueError) as exc:
            return ReadResult(pb.ERROR, f"entry {ledger_id}/{entry_id} is stored in journal segment {segment} at "
                                        f"offset {offset} but cannot be read back ({exc}); read it from another "
                                        f"replica")
        return ReadResult(pb.OK, "", head.lac, memoryview(data)[ENTRY_PAYLOAD_OFFSET:], head.digest)   # a view: no copy

    # -- garbage collection ---------------------------------------------------------------------

    def refuse_adds(self, ledger_ids: Iterable[int]) -> None:
        """Refuse every add to these ledgers (recovery adds too, with ERROR) until allow_adds: garbage collection
        drops their over-replicated copies meanwhile."""
        self._dropping.update(ledger_ids)

    def allow_adds(self, ledger_ids: Iterable[int]) -> None:
        self._dropping.difference_update(ledger_ids)

    async def delete_ledgers(self, ledger_ids: list[int], over_replicated: bool = False) -> int:
        """Drop ledgers that were deleted from metadata (the caller re-checked), or, over_replicated, whose metadata
        names this node nowhere any more (the caller refuses their adds and advanced their copy_drops); returns
        how many.

        The DELETE records are journaled under the checkpoint lock: the states leave memory when their
        records are appended, so a snapshot taken before they are durable could otherwise omit a ledger
        whose older records follow the snapshot's position (replay would find entries without a key).
        """
        async with self._checkpoint_lock:
            try:
                group = self.journal.group
            except JournalWriteError as exc:
                _log.warning("garbage collection skipped: %s", exc)
                return 0
            dropped = 0
            for ledger_id in ledger_ids:
                # From here on an add or fence of this id (a late writer) starts a fresh state whose
                # KEY record follows the DELETE record in the journal.
                state = self.ledgers.pop(ledger_id, None)
                if state is not None:
                    self._live.detach(state.index)
                    self._entries -= state.index.count
                    self._fenced -= state.fenced
                    self._changed.discard(ledger_id)
                    self._dropped.add(ledger_id)
                    self.journal.append(group, encode_delete(ledger_id))
                    dropped += 1
            if not dropped:
                return 0
            error = await group.outcome()
        if error is not None:
            # Deleted in metadata anyway; after a restart replay brings them back and the next round retries. Counted
            # as changes no checkpoint holds yet: compaction's checkpoint (only_if_changed) must write the drops
            # before it deletes the files they leave without live entries, or a restart would bring the ledgers
            # back pointing into deleted files.
            self._unjournaled_changes += dropped
            _log.warning("deleting ledgers is not durable: %s", error)
            return 0
        (self.metrics.gc_overreplicated_deleted if over_replicated else self.metrics.gc_ledgers_deleted).inc(dropped)
        return dropped

    async def compact(self, threshold: float) -> CompactionResult:
        """One compaction round; the steps and why a crash at any of them is safe: storage_node/compaction.py."""
        async with self._compaction_lock:
            if self.broken:
                return CompactionResult((), (), 0, 0)
            loop = asyncio.get_running_loop()
            sealed_below = self.journal.durable.segment
            sizes, segments = await loop.run_in_executor(None, _sealed_files, self.journal_dir, sealed_below)
            segment_bytes = self.config.journal_segment_bytes
            plan = plan_compaction(sizes, self._live.by_file, threshold,
                                   small_bytes=segment_bytes // 4, merge_bytes=segment_bytes,
                                   uncopyable=frozenset(self._uncopyable))
            if not plan:
                return CompactionResult((), (), 0, 0)
            moves = moves_out_of(self._live.holding(plan.rewrite), set(plan.rewrite))
            copied, failed = 0, None
            if moves:
                number = self._numbers.take()
                try:
                    locations = await loop.run_in_executor(
                        None, copy_records, self.journal_dir, number, [(m.location, m.length) for m in moves],
                    )
                except (UncopyableRecordError, OSError) as exc:
                    # The files without live bytes are still deleted below; one with a record that cannot be read
                    # back is never copied again, or it would stop every later round.
                    failed = exc
                    if isinstance(exc, UncopyableRecordError):
                        self._uncopyable.add(exc.file_number)
                else:
                    for move, location in zip(moves, locations):
                        if move.state.index.get(move.entry_id) == (move.location, move.length):
                            move.state.index.put(move.entry_id, location, move.length)
                            self._changed_state(move.state)
                    self._unjournaled_changes += 1
                    copied = plan.live_bytes
                self._numbers.finished(number)   # the copy ended: its file is complete and synced, or removed
            # What is deleted is decided under the checkpoint lock, with the checkpoint it relies on: no drop (whose
            # DELETE record may fail) comes between them.
            async with self._checkpoint_lock:
                # Not written again when the last checkpoint covers the same state (a failed copy on an idle node: a
                # full disk, where the files without live entries are to be deleted all the same).
                await self._checkpoint(only_if_changed=True)
                if any(n in segments and n >= self._checkpointed.segment and not self._live.by_file.get(n)
                       for n in plan.sources):
                    # A dead segment the newest checkpoint's position lies in (that checkpoint's own record sealed
                    # it): a checkpoint now lies past it (an idle node kept it until its next write otherwise).
                    await self._checkpoint(only_if_changed=False)
                # Its CHECKPOINT record, journaled again if its group failed.
                unrecorded = None if self._recorded == self._checkpointed else await self._record_checkpoint()
                # A source is deleted only when no slot points into it any more, whatever happened meanwhile, and a
                # journal segment only below the checkpoint's position (replay starts there): one not written again
                # may cover a position in a segment that its own CHECKPOINT record sealed.
                replayed_from = self._checkpointed.segment
                deleted = () if unrecorded is not None else tuple(
                    n for n in plan.sources
                    if not self._live.by_file.get(n) and (n not in segments or n < replayed_from))
            if unrecorded is not None:
                _log.warning("compaction deletes no file this round: the CHECKPOINT record of the newest checkpoint "
                             "is not durable (%s)", unrecorded)
            for number in deleted:
                self._readers.forget(number)
            self._uncopyable.difference_update(deleted)
            try:
                freed = await loop.run_in_executor(None, _delete_files, self.journal_dir, deleted)
            finally:
                self.files.look_again(deleted)      # the disk watch remembered their sizes
        self.metrics.gc_files_deleted.inc(len(deleted))
        self.metrics.gc_bytes_reclaimed.inc(max(freed - copied, 0))
        if failed is not None:
            raise failed
        return CompactionResult(plan.rewrite, deleted, copied, max(freed - copied, 0))

    # -- info -----------------------------------------------------------------------------------

    def entry_count(self) -> int:
        return self._entries

    def fenced_count(self) -> int:
        return self._fenced

    def data_bytes(self) -> int:
        """Bytes of journal segments and compacted files (what garbage collection shrinks), as the disk watch
        measured them last (storage_node/disk_usage.py): a scrape costs nothing."""
        files = self.files
        return files.last.journal_bytes if files is not None else 0


def _sealed_files(journal_dir, sealed_below: int) -> tuple[dict[int, int], frozenset[int]]:
    """Compaction candidates (number -> size): journal segments below the durable one, and all compacted files; and
    which of them are journal segments."""
    segments = [n for n in list_segments(journal_dir) if n < sealed_below]
    sizes = {n: data_file_path(journal_dir, n).stat().st_size for n in segments + list_compacted(journal_dir)}
    return sizes, frozenset(segments)


def _delete_files(journal_dir, numbers: tuple[int, ...]) -> int:
    freed = 0
    for number in numbers:
        path = data_file_path(journal_dir, number)
        freed += path.stat().st_size
        path.unlink()
    if numbers:
        fsync_directory(journal_dir)
    return freed

