"""Adding entries (rule 2, and the bookkeeping of rule 3): pure, no I/O.

The writer's pending adds in entry order. Each add goes to its write set; it succeeds at AQ acks from the
write set; LAC moves only over a gap-free prefix of succeeded adds, and adds complete strictly in entry
order. While failed nodes wait for replacement (an ensemble change), nothing completes, so that the new
fragment can start at a LAC that no longer moves (BookKeeper holds callbacks the same way).
"""
from __future__ import annotations

import collections
import dataclasses

from connector.client.errors import LedgerError, error_for_status, refuses_ledger
from connector.client.schedule import Schedule
from protos import ledger_pb2 as pb
from protos.digest import entry_digest


@dataclasses.dataclass(slots=True)
class PendingAdd:
    entry_id: int
    payload: bytes
    last_add_confirmed: int  # piggybacked; part of the digest, so a resend carries the same value
    digest: int
    write_set: tuple[str, ...]
    sent_at: float           # when it was sent to its write set first (adds are sent in entry order)
    acked: set[str] = dataclasses.field(default_factory=set)
    resent_at: dict[str, float] = dataclasses.field(default_factory=dict)   # replacement node -> when resent there


class AddSequence:
    """The pending adds of one ledger writer (or of a recovery's write-back, recovery=True)."""

    def __init__(self, ledger_id: int, schedule: Schedule, ensemble: tuple[str, ...], *,
                 last_add_confirmed: int = -1, length: int = 0, recovery: bool = False):
        self.ledger_id = ledger_id
        self.schedule = schedule
        self.ensemble = tuple(ensemble)
        self.recovery = recovery
        self.last_add_confirmed = last_add_confirmed
        # What every add carries as its LAC. A writer's moves with its LAC. A recovery's write-back carries the LAC
        # it started from, whatever it has written back since: a concurrent recovery may close the ledger below the
        # entries this one writes back (none of them was acknowledged to the writer), and a node holds the highest
        # LAC any add brought it, which a tailing reader then reads as the ledger's end (rules 2, 12, 17).
        self._piggyback_lac = last_add_confirmed if recovery else None
        self.next_entry_id = last_add_confirmed + 1
        self.length = length
        self.pending: collections.OrderedDict[int, PendingAdd] = collections.OrderedDict()
        self.failed_nodes: set[str] = set()
        self.error: LedgerError | None = None
        self.node_lac: dict[str, int] = {}  # the LAC each node is known to hold (piggybacked or explicit)
        self._write_sets: dict[int, tuple[str, ...]] = {}  # entry_id % E -> write set in this ensemble

    @property
    def flags(self) -> int:
        return pb.RECOVERY_ADD if self.recovery else pb.ADD_FLAG_NONE

    def append(self, payload: bytes, now: float = 0.0) -> tuple[PendingAdd, tuple[str, ...]]:
        """A new add with the next entry id, and the nodes to send it to now."""
        add = self.append_many((payload,), now)[0]
        return add, self.targets(add)

    def append_many(self, payloads, now: float = 0.0) -> list[PendingAdd]:
        """New adds with the next entry ids, one per payload, in order: what append does for each, in one
        call (every add of a call carries the same LAC: nothing completes in between)."""
        if self.error is not None:
            raise self.error
        lac = self.last_add_confirmed if self._piggyback_lac is None else self._piggyback_lac
        ledger_id, pending, write_set = self.ledger_id, self.pending, self._write_set
        entry_id = self.next_entry_id
        adds = []
        for payload in payloads:
            add = PendingAdd(entry_id, payload, lac, entry_digest(ledger_id, entry_id, lac, payload),
                             write_set(entry_id), now)
            pending[entry_id] = add
            adds.append(add)
            entry_id += 1
        self.next_entry_id = entry_id
        return adds

    def targets(self, add: PendingAdd) -> tuple[str, ...]:
        """The nodes to send add to now: its write set, less the failed nodes waiting for replacement."""
        if not self.failed_nodes:
            return add.write_set
        return tuple(n for n in add.write_set if n not in self.failed_nodes)

    def common_targets(self) -> tuple[str, ...] | None:
        """The nodes every add goes to now, when that is the same for all (every write set is the whole
        ensemble, E = WQ, and no node waits for replacement); None when it depends on the entry."""
        if self.failed_nodes or self.schedule.write_quorum != self.schedule.ensemble_size:
            return None
        return self.ensemble

    def _write_set(self, entry_id: int) -> tuple[str, ...]:
        """Rule 1's write set (schedule.py); it depends on entry_id % E only, so it is worked out once per
        position until the ensemble changes."""
        position = entry_id % self.schedule.ensemble_size
        write_set = self._write_sets.get(position)
        if write_set is None:
            write_set = self._write_sets[position] = self.schedule.write_set_nodes(entry_id, self.ensemble)
        return write_set

    def on_result(self, node: str, entry_id: int, status: int, message: str = "") -> list[PendingAdd]:
        """A node's answer for one entry; returns the adds that completed, in entry order."""
        add = self.pending.get(entry_id)
        if add is None or node not in add.write_set:
            return []  # late answer for a completed add, or from a node since replaced
        if status == pb.OK:
            add.acked.add(node)
            self.on_lac_written(node, add.last_add_confirmed)
            return self._complete()
        if refuses_ledger(status):  # fenced, wrong password: no other node would take it either
            self.fail(error_for_status(status, node=node, ledger=self.ledger_id, entry=entry_id, detail=message))
        elif status == pb.TOO_LARGE and not self.recovery:
            # over the node's --max-entry-bytes: a writer would only walk through the nodes with that limit. A
            # recovery's write-back replaces the node (rule 12): the entry was taken before, by nodes that take it.
            self.fail(error_for_status(status, node=node, ledger=self.ledger_id, entry=entry_id, detail=message))
        else:
            self.on_node_failure(node)
        return []

    def on_results(self, node: str, first: int, last: int, status: int, message: str = "") -> list[PendingAdd]:
        """A node's one answer for entries first..last (ledger.proto AddRange): exactly what on_result for each
        of them in turn would do, for the cost of one call; returns the adds that completed, in entry order.

        An OK range adds the node's ack to every add of the range whose write set holds it (rule 2: each
        add still completes at AQ acks of its own write set, striping's included), then completes what it
        can, in entry order, as the last of those calls would. Another status is taken from the first such
        add, as on_result takes it: it fails the ledger or the node, after which the rest would change
        nothing. Only pending adds can be answered, so the walk covers the pending ids within the range,
        however wide the range a node sent."""
        pending = self.pending
        ids = range(max(first, self.last_add_confirmed + 1), min(last, self.next_entry_id - 1) + 1)
        if status != pb.OK:
            for entry_id in ids:
                add = pending.get(entry_id)
                if add is not None and node in add.write_set:
                    return self.on_result(node, entry_id, status, message)
            return []
        get = pending.get
        last = None
        for entry_id in ids:
            add = get(entry_id)
            if add is not None and node in add.write_set:
                add.acked.add(node)
                last = add
        if last is None:
            return []
        self.on_lac_written(node, last.last_add_confirmed)     # adds carry LACs that grow with their ids
        return self._complete()

    def on_node_failure(self, node: str) -> None:
        """The node could not take adds (stream broken, error, read-only, timeout): rule 3 replaces it."""
        if node in self.ensemble and self.error is None:
            self.failed_nodes.add(node)

    def timed_out_nodes(self, now: float, timeout: float) -> set[str]:
        """Write-set nodes that have not acked an add sent more than timeout ago (a frozen node)."""
        late = set()
        for add in self.pending.values():
            if now - add.sent_at < timeout:
                break             # sent in entry order: every add after it is younger, resent or not
            late.update(n for n in add.write_set
                        if n not in add.acked and now - add.resent_at.get(n, add.sent_at) >= timeout)
        return late - self.failed_nodes

    def replace_nodes(self, new_ensemble: tuple[str, ...], now: float = 0.0) -> tuple[list[tuple[str, PendingAdd]],
                                                                                         list[PendingAdd]]:
        """The ensemble change is stored (new fragment at LAC+1); swap the failed nodes for their replacements.

        Returns (resends, completed). Every pending add is past the LAC, so inside the new fragment. Only an add
        whose write set held a replaced node is resent, and only to that node's replacement; the replaced node's
        ack no longer counts, because the metadata no longer lists it for that entry.
        """
        replacement = {old: new for old, new in zip(self.ensemble, new_ensemble) if old != new}
        self.ensemble = tuple(new_ensemble)
        self._write_sets.clear()
        self.failed_nodes -= set(replacement)
        resends = []
        for add in self.pending.values():
            if not set(add.write_set) & set(replacement):
                continue
            add.write_set = tuple(replacement.get(n, n) for n in add.write_set)
            add.acked &= set(add.write_set)
            for new in replacement.values():
                if new in add.write_set:
                    add.resent_at[new] = now   # the nodes it kept were sent it at sent_at, and are timed from then
            resends.extend((replacement[old], add) for old in replacement if replacement[old] in add.write_set)
        return resends, self._complete()

    def fail(self, error: LedgerError) -> list[PendingAdd]:
        """An unrecoverable error: every pending and every later add fails with it."""
        if self.error is None:
            self.error = error
        failed = list(self.pending.values())
        self.pending.clear()
        return failed

    def lac_targets(self) -> list[str]:
        """Nodes of the current ensemble that do not hold the LAC yet, once no add is pending to carry it:
        an idle writer sends it to them explicitly, and again until each has it (rules 2, 17)."""
        if self.pending or self.last_add_confirmed < 0:
            return []
        return [n for n in self.ensemble
                if self.node_lac.get(n, -1) < self.last_add_confirmed and n not in self.failed_nodes]

    def on_lac_written(self, node: str, lac: int) -> None:
        """The node holds lac: it acknowledged an add that carried it, or took it explicitly."""
        if lac > self.node_lac.get(node, -1):
            self.node_lac[node] = lac

    def _complete(self) -> list[PendingAdd]:
        completed: list[PendingAdd] = []
        if self.failed_nodes:
            return completed
        has_ack_quorum = self.schedule.has_ack_quorum
        next_id = self.last_add_confirmed + 1
        for entry_id, add in self.pending.items():
            if entry_id != next_id or not has_ack_quorum(add.acked, add.write_set):
                break
            completed.append(add)
            next_id += 1
        if completed:
            pop = self.pending.popitem
            for _ in completed:
                pop(last=False)
            self.last_add_confirmed = next_id - 1
            self.length += sum(len(add.payload) for add in completed)
        return completed
