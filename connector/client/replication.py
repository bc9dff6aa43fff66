"""Re-replication planning (BookKeeper's auditor and replication worker, decision half). Pure, no I/O.

A fragment is under-replicated when a node of its ensemble is lost: not registered any more (gone) or
decommissioned. Repairing it copies, onto a replacement node, exactly the entries the lost node was meant to
hold (rule 1: those whose write set includes it, inside the fragment's range), each read from another replica
of its write set and digest-checked; only when all of them are durable on the replacement does the fragment's
ensemble change in the metadata, by compare-and-set against the fragment as planned (and against the ledger's
copy_drops as planned: a node may have dropped the copies meanwhile, see replace_in_fragment). Entries keep their
original piggybacked LAC and digest, so a copy is byte-identical to what the writer sent. An entry that no
replica can supply stops the repair: the metadata then still names the old node (never drop an entry).
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

from connector.client.errors import LedgerError, status_name
from connector.client.ops.read import RangeCall, verified
from connector.client.placement import replace_nodes
from connector.client.schedule import Schedule
from metadata.model import Fragment, LedgerMetadata, NodeRegistration
from metadata.update_loop import Transform
from protos import ledger_pb2 as pb


class ReplicationError(LedgerError):
    """A fragment could not be re-replicated; its metadata was left unchanged."""


class ReplicationConflictError(ReplicationError):
    """The ledger's metadata changed since the repair was planned: plan again from the stored record."""


class ReplicaWriteError(ReplicationError):
    """A replacement node did not take the copies: choose another replacement."""

    def __init__(self, node: str, message: str):
        super().__init__(message)
        self.node = node


# -- what is under-replicated --------------------------------------------------------------------------------------

def lost_nodes(nodes: Iterable[str], registered: Iterable[str], decommissioned: Iterable[str],
               broken: Iterable[str] = ()) -> dict[str, str]:
    """The nodes among `nodes` whose copies no longer count, with why. A broken node (its journal failed) stays
    registered but serves nothing until it is restarted, and may never be: its copies are made again elsewhere."""
    registered, decommissioned, broken = set(registered), set(decommissioned), set(broken)
    lost = {}
    for node in nodes:
        if node in decommissioned:
            lost[node] = "decommissioned"
        elif node not in registered:
            lost[node] = "gone (not registered)"
        elif node in broken:
            lost[node] = "broken (it serves nothing until restarted)"
    return lost


class Absences:
    """When a node that is not registered counts as gone: once it has been away for `grace` seconds (BookKeeper's
    lostBookieRecoveryDelay). A restart, or a ZooKeeper session that expired and registered again, then costs no
    copies (which the node, back, keeps until its next check for over-replicated ledgers, a day by default:
    --gc-overreplicated-interval). A node this auditor never saw registered counts as away since the auditor
    started. Decommissioned and broken nodes are not excused. Pure: the caller passes the registered nodes and the
    clock."""

    def __init__(self, grace: float, now: float):
        self.grace = grace
        self._started = now
        self._away: dict[str, float] = {}     # node -> when this auditor first found it unregistered
        self._registered: frozenset[str] = frozenset()

    def update(self, registered: Iterable[str], now: float) -> None:
        registered = frozenset(registered)
        for node in self._registered - registered:
            self._away.setdefault(node, now)
        for node in registered:
            self._away.pop(node, None)
        self._registered = registered

    def excused(self, node: str, now: float) -> bool:
        """Whether node, if it is not registered, has been away for less than the grace."""
        return node not in self._registered and now - self._away.get(node, self._started) < self.grace

    def expired(self, now: float) -> frozenset[str]:
        """What changes when an absence passes the grace (for AuditSchedule: a scan then finds the node gone): the
        nodes away for longer, and "*" once every node this auditor never saw is."""
        expired = {node for node, since in self._away.items() if now - since >= self.grace}
        return frozenset(expired | ({"*"} if now - self._started >= self.grace else set()))


class AuditSchedule:
    """When the auditor (`ledger audit --watch`) scans every ledger's metadata, as BookKeeper's auditor does: when
    the nodes change, and in a periodic check of all ledgers. A ledger is under-replicated only through a node that
    is gone or decommissioned, so while the nodes stay as they were at the last scan, another finds nothing new (a
    ledger that scan could not repair is looked at again alone, Rereplicator.retrying); the scan costs a read of
    every ledger, which a cluster gains by the thousand a day. The nodes are given as the caller read them before
    the scan: each registered node with
    its process id (a restart counts as a change: its disk may have been replaced) and the decommissioned ones.
    full_seconds bounds the time between scans all the same. Pure: the caller passes the nodes and the clock."""

    def __init__(self, full_seconds: float):
        self.full_seconds = full_seconds
        self._nodes: object = None
        self._scanned_at = 0.0

    def reason(self, nodes: object, now: float) -> str | None:
        """Why to scan now, or None to skip this round."""
        if self._nodes is None:
            return "the first round"
        if nodes != self._nodes:
            return "the nodes changed"
        if now - self._scanned_at >= self.full_seconds:
            return "the periodic check of every ledger"
        return None

    def scanned(self, nodes: object, now: float) -> None:
        """A scan of every ledger started at `now` with these nodes."""
        self._nodes, self._scanned_at = nodes, now

    def next_full_scan(self, now: float) -> float:
        return max(0.0, self._scanned_at + self.full_seconds - now)


@dataclasses.dataclass(frozen=True)
class FragmentRepair:
    """One fragment to move off its lost nodes. last_entry_id is -1 for the open end of an OPEN ledger,
    which cannot be copied before the ledger is recovered and closed."""

    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    ensemble: tuple[str, ...]
    lost: tuple[str, ...]
    closed: bool
    copy_drops: int = 0      # the ledger's copy_drops when the repair was planned, before anything was copied

    def describe(self) -> str:
        end = str(self.last_entry_id) if self.closed else "open"
        return f"entries {self.first_entry_id}..{end} on [{', '.join(self.ensemble)}]"


def fragments_to_repair(meta: LedgerMetadata, lost: Iterable[str]) -> list[FragmentRepair]:
    """Fragments of the ledger whose ensemble holds a lost node, in entry order. A fragment is closed (its range
    fixed, its entries copyable) in a closed ledger, and in an OPEN one when an ensemble change ended it: the next
    fragment starts at the writer's LAC + 1, so every entry before it was acknowledged and no add goes to it."""
    lost = set(lost)
    repairs = []
    ranges = meta.fragment_ranges()
    for index, (first, last, fragment) in enumerate(ranges):
        if meta.is_closed:
            # A fragment may start past the end (an ensemble change right before the close): nothing to copy.
            last = min(last, meta.last_entry_id)
        moved = tuple(n for n in fragment.ensemble if n in lost)
        if moved:
            repairs.append(FragmentRepair(meta.ledger_id, first, last, fragment.ensemble, moved,
                                          closed=meta.is_closed or index + 1 < len(ranges),
                                          copy_drops=meta.copy_drops))
    return repairs


# -- what to copy where ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class EntryCopy:
    """One entry: the replicas to read it from, in order, and the replacement nodes that need it."""

    entry_id: int
    sources: tuple[str, ...]
    targets: tuple[str, ...]


def choose_replacements(repair: FragmentRepair, nodes: Mapping[str, NodeRegistration],
                        exclude: Iterable[str] = ()) -> tuple[str, ...]:
    """The fragment's ensemble with each lost node swapped for a writable node outside it (placement)."""
    return replace_nodes(nodes, repair.ensemble, repair.lost, exclude)


def plan_copies(repair: FragmentRepair, schedule: Schedule, new_ensemble: tuple[str, ...]) -> list[EntryCopy]:
    """Every entry of the fragment whose write set includes a lost node, for that node's replacement.

    Sources are the other replicas of the write set first; the lost nodes come last, as a fallback when
    they still answer (a node being decommissioned while up), so that a dead node costs nothing.
    """
    if not repair.closed:
        raise ReplicationError(f"ledger {repair.ledger_id} is not closed: recover it before copying its last "
                               "fragment")
    replacement = {old: new for old, new in zip(repair.ensemble, new_ensemble) if old != new}
    copies = []
    for entry_id in range(repair.first_entry_id, repair.last_entry_id + 1):
        write_set = schedule.write_set_nodes(entry_id, repair.ensemble)
        targets = tuple(replacement[n] for n in write_set if n in replacement)
        if targets:
            kept = tuple(n for n in write_set if n not in replacement)
            copies.append(EntryCopy(entry_id, kept + tuple(n for n in write_set if n in replacement), targets))
    return copies


def replace_in_fragment(repair: FragmentRepair, new_ensemble: tuple[str, ...]) -> Transform:
    """For update_ledger: the repaired fragment's ensemble becomes new_ensemble, provided the fragment (its
    start, range and ensemble) and the ledger's end are still as planned; else the copies may not cover it. In an
    OPEN ledger only a fragment an ensemble change ended (not the last): the writer changes only the last one, so
    its next change, whose CAS this one makes it re-read, keeps this.

    Also refused once a node dropped copies of the ledger since the repair was planned (copy_drops advanced): a
    node drops the copies of a CLOSED ledger that names it nowhere (storage_node/gc.py), and the copies this repair
    made to its replacements before the metadata names them are exactly such copies. The repair then plans and
    copies again; the node refuses copies while it drops, and takes them afresh afterwards."""
    def transform(meta: LedgerMetadata) -> LedgerMetadata | None:
        ranges = meta.fragment_ranges()
        for index, (first, last, fragment) in enumerate(ranges):
            if first != repair.first_entry_id:
                continue
            if fragment.ensemble == tuple(new_ensemble):
                return None  # stored already (our own earlier attempt, or another repairer's identical one)
            if meta.copy_drops != repair.copy_drops:
                raise ReplicationConflictError(
                    f"ledger {repair.ledger_id}: a node dropped copies of it while the fragment {repair.describe()} "
                    "was re-replicated (maybe those just made); copying again")
            fixed = meta.is_closed or index + 1 < len(ranges)
            end = min(last, meta.last_entry_id) if meta.is_closed else last
            if fixed and fragment.ensemble == repair.ensemble and end == repair.last_entry_id:
                fragments = list(meta.fragments)
                fragments[index] = Fragment(first, tuple(new_ensemble))
                return meta.replace(fragments=tuple(fragments))
            break
        raise ReplicationConflictError(
            f"ledger {repair.ledger_id}: the fragment {repair.describe()} changed while it was re-replicated; "
            "planning again")
    return transform


# -- reading the copies ----------------------------------------------------------------------------------------------

class CopyReads:
    """Reads a batch of entries for copying: one ReadRange per source node and round, failing over entry by
    entry to the next replica. Keeps whole responses, because a copy must carry the original LAC and digest.

    A node that does not return an entry is never taken as proof that the entry does not exist (rule 8): the
    entry is read elsewhere, and if no replica delivers it the batch fails.
    """

    def __init__(self, ledger_id: int, copies: list[EntryCopy]):
        self.ledger_id = ledger_id
        self.copies = {c.entry_id: c for c in copies}
        self.entries: dict[int, pb.ReadResponse] = {}
        self.failures: dict[int, dict[str, str]] = {c.entry_id: {} for c in copies}
        self._next_source = {c.entry_id: 0 for c in copies}

    def calls(self) -> list[RangeCall]:
        """The next round: for each entry still missing, its next untried source; one call per node."""
        wanted: dict[str, list[int]] = {}
        for entry_id, copy in self.copies.items():
            index = self._next_source[entry_id]
            if entry_id not in self.entries and index < len(copy.sources):
                wanted.setdefault(copy.sources[index], []).append(entry_id)
        return [RangeCall(node, min(ids), max(ids)) for node, ids in sorted(wanted.items())]

    def on_entry(self, node: str, response: pb.ReadResponse) -> None:
        copy = self.copies.get(response.entry_id)
        if copy is None or response.entry_id in self.entries or node not in copy.sources:
            return
        if response.status == pb.OK and verified(self.ledger_id, response, response.payload):
            self.entries[response.entry_id] = response
        else:
            reason = "digest mismatch" if response.status == pb.OK else status_name(response.status)
            self.failures[response.entry_id][node] = reason

    def on_call_done(self, call: RangeCall, reason: str = "") -> None:
        """The call ended (reason empty when it finished OK): entries it was asked for and did not deliver
        move on to their next source."""
        for entry_id, copy in self.copies.items():
            index = self._next_source[entry_id]
            if (index < len(copy.sources) and copy.sources[index] == call.node
                    and call.first_entry_id <= entry_id <= call.last_entry_id):
                self._next_source[entry_id] = index + 1
                if entry_id not in self.entries:
                    self.failures[entry_id].setdefault(call.node, reason or "not returned")

    @property
    def done(self) -> bool:
        return not self.calls()

    def error(self) -> ReplicationError | None:
        """Set when an entry could not be read from any replica: the repair must stop."""
        for entry_id in sorted(self.copies):
            if entry_id not in self.entries and self._next_source[entry_id] >= len(self.copies[entry_id].sources):
                reasons = ", ".join(f"{n}: {r}" for n, r in sorted(self.failures[entry_id].items()))
                return ReplicationError(
                    f"entry {entry_id} of ledger {self.ledger_id} could not be read from any replica ({reasons}); "
                    "its fragment was not moved. Bring a replica back (restart the node with its data) and retry")
        return None


# -- writing the copies ----------------------------------------------------------------------------------------------

class CopyWrites:
    """Acknowledgements of a batch of copies sent to the replacement nodes (recovery adds)."""

    def __init__(self, ledger_id: int, copies: list[EntryCopy]):
        self.ledger_id = ledger_id
        self.waiting = {(c.entry_id, node) for c in copies for node in c.targets}
        self.failure: ReplicaWriteError | None = None

    def on_result(self, node: str, entry_id: int, status: int, message: str = "") -> None:
        if (entry_id, node) not in self.waiting:
            return
        if status == pb.OK:
            self.waiting.discard((entry_id, node))
        else:
            self.on_node_failure(node, f"{status_name(status)} {message}".strip())

    def on_node_failure(self, node: str, reason: str) -> None:
        if self.failure is None and any(n == node for _, n in self.waiting):
            self.failure = ReplicaWriteError(
                node, f"replacement node {node} did not store the copies of ledger {self.ledger_id} ({reason}); "
                      "another node is chosen")

    @property
    def done(self) -> bool:
        return not self.waiting or self.failure is not None
