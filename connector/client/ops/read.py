"""Reading entries (rule 1 decides where they are): range reads spread over the ensemble, failover to the
next replica of the write set, digest verification. Pure.

A read of [first, last] is cut into chunks inside fragments; each chunk asks a few nodes whose write sets
together hold every entry of the chunk (one node when E = WQ), rotating the starting node from chunk to chunk
(from the read's first entry on, so that single-entry reads of different entries start at different nodes)
so that all nodes of a striped ledger serve in parallel. Nodes that failed the client recently (the runner's
record, placement.Quarantine) are asked last, like BookKeeper's slow-bookie avoidance. A call that has not
answered within the speculative timeout (Speculation, for chunk and entry reads alike) has its part asked of
other replicas as well (ChunkRead.speculate, EntryRead.speculate), the first valid answer counts. Entries a
chunk's nodes did not deliver are read one by one from the other replicas of their write set. Every entry
returned is digest-verified; a plain read never concludes that an entry is absent.

How many entries a chunk asks for, and how many chunks are in flight, is ReadWindow's: about CHUNK_BYTES a chunk,
from the ledger's length, or for a ledger whose metadata does not know it, from the entries received.
"""
from __future__ import annotations

import dataclasses
from typing import Collection, Hashable, Iterable, Sequence

from connector.client.errors import DigestMismatchError, LedgerError, NodeError, status_name
from connector.client.schedule import Schedule
from metadata.model import LedgerMetadata
from protos import ledger_pb2 as pb
from protos.digest import entry_digest


DIGEST_MISMATCH = "digest mismatch"
CHUNK_BYTES = 4 * 1024 * 1024   # what one chunk of a read asks for, about; 2E chunks are in flight
MAX_CHUNK_ENTRIES = 1024
FIRST_CHUNK_ENTRIES = 4   # of a ledger whose length the metadata does not give, before any entry size is known
DEFAULT_SPECULATIVE_READ_TIMEOUT = 0.5   # seconds a read waits for a node before asking another replica as well


@dataclasses.dataclass(frozen=True)
class RangeCall:
    node: str
    first_entry_id: int
    last_entry_id: int


@dataclasses.dataclass(frozen=True)
class EntryCall:
    """One replica asked for one entry (a Read)."""

    node: str
    entry_id: int


@dataclasses.dataclass(frozen=True)
class Entry:
    entry_id: int
    payload: bytes | memoryview   # a memoryview: see ReadHandle.read(views=True)


def verified(ledger_id: int, response: pb.ReadResponse, payload: bytes | memoryview) -> bool:
    """payload: response.payload, taken once by the caller (protobuf copies a bytes field on each access)."""
    return entry_digest(ledger_id, response.entry_id, response.last_add_confirmed, payload) == response.digest


def entry_problem(ledger_id: int, response: pb.ReadResponse, payload: bytes | memoryview) -> str:
    """Why a node's answer for one entry does not deliver it (its status, or a digest mismatch); "" if it does.
    response: a pb.ReadResponse or a protos.wire.ReadResponseView; payload as for verified."""
    if response.status != pb.OK:
        return status_name(response.status)
    return "" if verified(ledger_id, response, payload) else DIGEST_MISMATCH


def preferred_order(nodes: Sequence[str], try_last: Collection[str]) -> list[str]:
    """nodes in their order, those that failed recently (try_last) moved to the end."""
    return sorted(nodes, key=lambda node: node in try_last)


class Speculation:
    """When a read asks other replicas as well (BookKeeper's speculative reads), the same for chunk and entry reads:
    a call that has made no progress (it started, or an answer of it came) for timeout seconds is overdue, once.
    Its node is then slow (asked last by later reads) and the read asks its part of replicas it has not asked yet,
    in the read's order (ChunkRead.speculate, EntryRead.speculate); the first valid copy of an entry counts, and
    the calls still running once the read is complete are cancelled. timeout 0: never."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self._waiting: dict[Hashable, float] = {}   # call -> when it last made progress, until overdue or ended

    def on_start(self, call: Hashable, now: float) -> None:
        if self.timeout:
            self._waiting[call] = now

    def on_progress(self, call: Hashable, now: float) -> None:
        if call in self._waiting:
            self._waiting[call] = now

    def on_end(self, call: Hashable) -> None:
        self._waiting.pop(call, None)

    @property
    def due(self) -> float | None:
        """When the next call is overdue; None if none can be."""
        return min(self._waiting.values()) + self.timeout if self._waiting else None

    def overdue(self, now: float) -> list:
        """The calls overdue at now, each reported once."""
        late = [call for call, since in self._waiting.items() if since + self.timeout <= now]
        for call in late:
            del self._waiting[call]
        return late


class EntryRead:
    """One entry from the replicas of its write set, in write-set order (those that failed the client recently,
    try_last, last), skipping nodes that already failed it. Several may be asked at once (a speculative read):
    the first valid answer is the entry."""

    def __init__(self, ledger_id: int, entry_id: int, write_set: tuple[str, ...], tried: dict[str, str] | None = None,
                 try_last: Collection[str] = ()):
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.failures: dict[str, str] = dict(tried or {})
        self._untried = preferred_order([n for n in write_set if n not in self.failures], try_last)
        self.entry: Entry | None = None

    def next_node(self) -> str | None:
        return self._untried.pop(0) if self._untried and self.entry is None else None

    def calls(self) -> list[EntryCall]:
        """The call to make now, if a replica is left and the entry is not in: the first, or the next after a
        failure."""
        node = self.next_node()
        return [] if node is None else [EntryCall(node, self.entry_id)]

    def speculate(self, slow: str) -> list[EntryCall]:
        """slow has not answered within the speculative timeout (Speculation): the next replica is asked as well."""
        return self.calls()

    @property
    def untried(self) -> bool:
        """Whether a replica is left to ask."""
        return bool(self._untried) and self.entry is None

    @property
    def complete(self) -> bool:
        """The entry was delivered (calls still running may be cancelled)."""
        return self.entry is not None

    def on_response(self, node: str, response: pb.ReadResponse) -> None:
        if self.entry is not None:
            return   # another replica's answer came first
        payload = response.payload
        problem = entry_problem(self.ledger_id, response, payload)
        if problem:
            self.failures[node] = problem
        else:
            self.entry = Entry(self.entry_id, payload)

    def on_failure(self, node: str, reason: str) -> None:
        self.failures[node] = reason

    def error(self) -> LedgerError:
        reasons = ", ".join(f"{n}: {r}" for n, r in sorted(self.failures.items()))
        cls = DigestMismatchError if DIGEST_MISMATCH in self.failures.values() else NodeError
        return cls(f"entry {self.entry_id} of ledger {self.ledger_id} could not be read from any replica "
                   f"({reasons}); check the nodes, then read again")


def _residues(first: int, last: int, size: int) -> set[int]:
    """The entry ids of [first, last] modulo E: a write set depends on nothing else, so a walk over them (at most
    E, whatever the chunk's length) finds the same nodes as a walk over every entry."""
    return {entry % size for entry in range(first, min(last, first + size - 1) + 1)}


def _positions(size: int, rotation: int, ensemble: tuple[str, ...], try_last: Collection[str]) -> list[int]:
    """Ensemble positions from rotation on, those of nodes in try_last moved to the end."""
    rotated = [ensemble[(rotation + step) % size] for step in range(size)]
    return [ensemble.index(node) for node in preferred_order(rotated, try_last)]


def _cover(schedule: Schedule, ensemble: tuple[str, ...], residues: Iterable[int],
           positions: Iterable[int]) -> list[str]:
    """Nodes, taken in the order of positions, whose write sets together hold every entry id with one of these
    residues (modulo E); as many as positions can, if they cannot hold all."""
    uncovered = set(residues)
    nodes = []
    for position in positions:
        if not uncovered:
            break
        held = {e for e in uncovered if position in schedule.write_set(e)}
        if held:
            nodes.append(ensemble[position])
            uncovered -= held
    return nodes


class ChunkRead:
    """Entries [first, last] of one fragment."""

    def __init__(self, ledger_id: int, schedule: Schedule, ensemble: tuple[str, ...], first: int, last: int,
                 rotation: int):
        self.ledger_id = ledger_id
        self.schedule = schedule
        self.ensemble = ensemble
        self.first = first
        self.last = last
        self.rotation = rotation
        self.calls: list[RangeCall] = []
        self.entries: dict[int, Entry] = {}
        self.failures: dict[int, dict[str, str]] = {}
        self._open_calls = 0
        self.start()

    def start(self, try_last: Collection[str] = ()) -> list[RangeCall]:
        """The calls to make first (before any is made): the covering nodes from the chunk's rotation on, nodes
        that failed the client recently (try_last) only where no other node will do."""
        positions = _positions(self.schedule.ensemble_size, self.rotation, self.ensemble, try_last)
        nodes = _cover(self.schedule, self.ensemble, _residues(self.first, self.last, self.schedule.ensemble_size),
                       positions)
        self.calls = [RangeCall(n, self.first, self.last) for n in nodes]
        self._open_calls = len(self.calls)
        return list(self.calls)

    def speculate(self, slow: str, try_last: Collection[str] = ()) -> list[RangeCall]:
        """slow has not answered within the speculative timeout: calls to nodes this chunk has not asked yet for
        the entries slow was to deliver and nobody has delivered yet (none if no other replica is left). Their
        answers count like any other: the first valid copy of an entry is taken."""
        wanted = [e for e in range(self.first, self.last + 1)
                  if e not in self.entries and slow in self.write_set(e)]
        if not wanted:
            return []
        size = self.schedule.ensemble_size
        asked = {call.node for call in self.calls}
        positions = [p for p in _positions(size, self.rotation, self.ensemble, try_last)
                     if self.ensemble[p] not in asked]
        nodes = _cover(self.schedule, self.ensemble, {e % size for e in wanted}, positions)
        calls = [RangeCall(n, wanted[0], wanted[-1]) for n in nodes]
        self.calls += calls
        self._open_calls += len(calls)
        return calls

    @property
    def complete(self) -> bool:
        """Every entry of the chunk was delivered (calls still running may be cancelled)."""
        return len(self.entries) == self.last - self.first + 1

    def on_entry(self, node: str, response: pb.ReadResponse) -> None:
        entry_id = response.entry_id
        if not self.first <= entry_id <= self.last or entry_id in self.entries:
            return
        payload = response.payload
        problem = entry_problem(self.ledger_id, response, payload)
        if problem:
            self.failures.setdefault(entry_id, {})[node] = problem
        else:
            self.entries[entry_id] = Entry(entry_id, payload)

    def on_call_done(self, call: RangeCall, reason: str = "") -> None:
        """The call ended (reason empty when it finished OK): what it did not deliver is retried elsewhere."""
        self._open_calls -= 1
        for entry_id in range(call.first_entry_id, call.last_entry_id + 1):
            if entry_id not in self.entries and call.node in self.write_set(entry_id):
                self.failures.setdefault(entry_id, {}).setdefault(call.node, reason or "not returned")

    @property
    def calls_done(self) -> bool:
        return self._open_calls == 0

    def write_set(self, entry_id: int) -> tuple[str, ...]:
        return self.schedule.write_set_nodes(entry_id, self.ensemble)

    def on_failover_done(self, read: EntryRead) -> None:
        """A single-entry read for what the range calls missed delivered its entry."""
        if read.entry is not None:
            self.entries[read.entry_id] = read.entry

    def failovers(self, try_last: Collection[str] = ()) -> list[EntryRead]:
        """Single-entry reads for what the range calls did not deliver (only once they all ended)."""
        return [
            EntryRead(self.ledger_id, e, self.write_set(e), self.failures.get(e), try_last)
            for e in range(self.first, self.last + 1) if e not in self.entries
        ]

    def in_order(self) -> list[Entry]:
        return [self.entries[e] for e in range(self.first, self.last + 1)]


class ChunkPlan:
    """The chunks of a read of [first, last], cut one at a time (ReadWindow sizes each as the read goes), never
    across a fragment's end. The chunks' rotations count from the read's first entry: consecutive chunks start at
    consecutive nodes, and reads of single entries (a binary search, a time search) at the entries' own."""

    def __init__(self, meta: LedgerMetadata, first: int, last: int):
        self._schedule = Schedule(meta.ensemble_size, meta.write_quorum, meta.ack_quorum)
        self._ledger_id = meta.ledger_id
        self._fragments = []   # (first, last, ensemble) of the read inside each fragment it touches
        for fragment_first, fragment_last, fragment in meta.fragment_ranges():
            lo, hi = max(first, fragment_first), last if fragment_last < 0 else min(last, fragment_last)
            if lo <= hi:
                self._fragments.append((lo, hi, fragment.ensemble))
        self._fragments.reverse()   # popped from the end
        self._rotation = first

    def next(self, entries: int) -> ChunkRead | None:
        """The next chunk, of at most this many entries; None once the read is planned."""
        if not self._fragments:
            return None
        lo, hi, ensemble = self._fragments.pop()
        chunk_last = min(hi, lo + entries - 1)
        if chunk_last < hi:
            self._fragments.append((chunk_last + 1, hi, ensemble))
        chunk = ChunkRead(self._ledger_id, self._schedule, ensemble, lo, chunk_last, self._rotation)
        self._rotation += 1
        return chunk


def plan_chunks(meta: LedgerMetadata, first: int, last: int, chunk_entries: int) -> list[ChunkRead]:
    """Every chunk of a read at once, all of chunk_entries (the last of a fragment may be shorter)."""
    plan = ChunkPlan(meta, first, last)
    return list(iter(lambda: plan.next(chunk_entries), None))


class ReadWindow:
    """How many entries the next chunk of a read asks for, and how many chunks may be in flight: chunks of about
    CHUNK_BYTES, 2E of them in flight (all nodes of a striped ledger serve), so a read holds about 2E + 1 chunks.

    The chunk size follows from the ledger's average entry size when its metadata gives its length (closed by
    its writer). An OPEN ledger (length 0) or one closed by recovery (length -1) does not: its read starts with one
    chunk of FIRST_CHUNK_ENTRIES alone, and sizes every later chunk from the entries received (the larger of the
    average so far and the last chunk's, so that entries growing along the ledger shrink the chunks at once).
    Before, such a read assumed 4 KiB entries: 1024-entry chunks, 2E of them, about 1.5 GiB of 256 KiB entries.
    """

    def __init__(self, meta: LedgerMetadata, chunk_bytes: int = CHUNK_BYTES):
        self._chunk_bytes = chunk_bytes
        self._most_in_flight = max(2, 2 * meta.ensemble_size)
        self._known = meta.length > 0
        self._average = meta.length / max(1, meta.last_entry_id + 1) if self._known else None
        self._entries = self._bytes = 0

    @property
    def chunk_entries(self) -> int:
        if self._average is None:
            return FIRST_CHUNK_ENTRIES
        return max(1, min(MAX_CHUNK_ENTRIES, int(self._chunk_bytes / max(self._average, 1))))

    @property
    def chunks_in_flight(self) -> int:
        return 1 if self._average is None else self._most_in_flight

    def on_chunk_read(self, entries: int, payload_bytes: int) -> None:
        """A chunk arrived with these entries holding these bytes (its payloads)."""
        if self._known or entries == 0:
            return
        self._entries += entries
        self._bytes += payload_bytes
        self._average = max(self._bytes / self._entries, payload_bytes / entries)
