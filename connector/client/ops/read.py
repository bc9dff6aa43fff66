"""Reading entries (rule 1 decides where they are): range reads spread over the ensemble, failover to the
next replica of the write set, digest verification. Pure.

A read of [first, last] is cut into chunks inside fragments; each chunk asks a few nodes whose write sets
together hold every entry of the chunk (one node when E = WQ), rotating the starting node from chunk to chunk
so that all nodes of a striped ledger serve in parallel. Entries a chunk's nodes did not deliver are read one
by one from the other replicas of their write set.
"""
from __future__ import annotations

import dataclasses

from connector.client.errors import DigestMismatchError, LedgerError, NodeError, status_name
from connector.client.schedule import Schedule
from metadata.model import LedgerMetadata
from protos import ledger_pb2 as pb
from protos.digest import entry_digest


DIGEST_MISMATCH = "digest mismatch"


@dataclasses.dataclass(frozen=True)
class RangeCall:
    node: str
    first_entry_id: int
    last_entry_id: int


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


class EntryRead:
    """One entry from the replicas of its write set, in write-set order, skipping nodes that already failed it."""

    def __init__(self, ledger_id: int, entry_id: int, write_set: tuple[str, ...], tried: dict[str, str] | None = None):
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.failures: dict[str, str] = dict(tried or {})
        self._untried = [n for n in write_set if n not in self.failures]
        self.entry: Entry | None = None

    def next_node(self) -> str | None:
        return self._untried.pop(0) if self._untried and self.entry is None else None

    def on_response(self, node: str, response: pb.ReadResponse) -> None:
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


def _cover(schedule: Schedule, ensemble: tuple[str, ...], first: int, last: int, rotation: int) -> list[str]:
    """Nodes, starting at position rotation, whose write sets together hold every entry of [first, last].

    A write set depends only on the entry id modulo E, so the walk covers those residues (at most E of them,
    whatever the chunk's length) rather than every entry."""
    size = schedule.ensemble_size
    uncovered = {entry % size for entry in range(first, min(last, first + size - 1) + 1)}
    nodes = []
    for step in range(size):
        position = (rotation + step) % size
        held = {e for e in uncovered if position in schedule.write_set(e)}
        if held:
            nodes.append(ensemble[position])
            uncovered -= held
        if not uncovered:
            break
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
        self.calls = [RangeCall(n, first, last) for n in _cover(schedule, ensemble, first, last, rotation)]
        self.entries: dict[int, Entry] = {}
        self.failures: dict[int, dict[str, str]] = {}
        self._open_calls = len(self.calls)

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
        for entry_id in range(self.first, self.last + 1):
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

    def failovers(self) -> list[EntryRead]:
        """Single-entry reads for what the range calls did not deliver (only once they all ended)."""
        return [
            EntryRead(self.ledger_id, e, self.write_set(e), self.failures.get(e))
            for e in range(self.first, self.last + 1) if e not in self.entries
        ]

    def in_order(self) -> list[Entry]:
        return [self.entries[e] for e in range(self.first, self.last + 1)]


def plan_chunks(meta: LedgerMetadata, first: int, last: int, chunk_entries: int) -> list[ChunkRead]:
    schedule = Schedule(meta.ensemble_size, meta.write_quorum, meta.ack_quorum)
    chunks = []
    for fragment_first, fragment_last, fragment in meta.fragment_ranges():
        lo = max(first, fragment_first)
        hi = last if fragment_last < 0 else min(last, fragment_last)
        for start in range(lo, hi + 1, chunk_entries):
            chunks.append(ChunkRead(meta.ledger_id, schedule, fragment.ensemble, start,
                                    min(hi, start + chunk_entries - 1), len(chunks)))
    return chunks
