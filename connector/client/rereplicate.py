"""Re-replication I/O: audit, repair and decommission on top of the planning in replication.py.

Reads go to the surviving replicas over the client transport, copies go to the replacement as recovery adds
with the ledger's master key, and the fragment's ensemble changes by update_ledger only after the replacement
acknowledged (fsynced) every copy. OPEN ledgers are recovered (fenced and closed) first: copying the open end
of a ledger a writer may still extend would race the writer. An audit's repair does that only to a ledger whose
writer is gone. Of one whose writer is alive, it moves the fragments the writer's ensemble changes ended (their
entries were all acknowledged, no add goes to them) and defers the last one if it names a lost node
(LedgerRepair.deferred): repair_deferred looks at that ledger again, alone, until it is closed or its writer dies.
Fencing a live writer because a node it has already replaced, or will replace at its next add, is gone would stop
every Spark task and stream writer whose ledger ever touched that node. A decommission, which must drain the
node, still fences.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Callable, Iterable, Sequence

from connector.client.api import LedgerClient
from connector.client.errors import LedgerError, NoSuchLedgerError
from connector.client.placement import writable
from connector.client.replication import (
    Absences,
    CopyReads,
    CopyWrites,
    EntryCopy,
    FragmentRepair,
    ReplicaWriteError,
    ReplicationConflictError,
    ReplicationError,
    choose_replacements,
    fragments_to_repair,
    lost_nodes,
    plan_copies,
    replace_in_fragment,
)
from connector.client.runner import Context, Runtime, read_range, schedule_of
from metadata import registry
from metadata.errors import PlacementChangedError
from metadata.model import LedgerMetadata, LedgerState
from metadata.update_loop import update_ledger
from protos import ledger_pb2 as pb
from protos import wire
from protos.digest import master_key, password_hash

BATCH_ENTRIES = 256          # entries read, then written, per round trip: bounds the memory of a copy
MAX_REPLANS = 10             # metadata changes under one ledger's repair before giving up on it for this round
MAX_REPLACEMENTS = 3         # replacement nodes tried for one fragment
NODES_READ_SECONDS = 5.0     # how stale the auditor's view of the node registry may be while it repairs
DECOMMISSION_PASSES = 5      # scans for ledgers placed on the node just before it was marked


@dataclasses.dataclass(frozen=True)
class LedgerAudit:
    """An under-replicated ledger: its fragments on lost nodes, and why each node is lost."""

    meta: LedgerMetadata
    repairs: tuple[FragmentRepair, ...]
    reasons: dict[str, str]


@dataclasses.dataclass(frozen=True)
class LedgerRepair:
    """The outcome for one ledger: fragments moved and entries copied, or why it was left as it was."""

    ledger_id: int
    fragments: int = 0
    entries: int = 0
    recovered: bool = False
    error: str = ""
    deferred: bool = False   # OPEN, its writer alive: left to it for now (repair_deferred looks again)

    @property
    def ok(self) -> bool:
        return not self.error

    def describe(self) -> str:
        if self.error:
            return f"ledger {self.ledger_id}: NOT repaired: {self.error}"
        if self.deferred:
            moved = f"moved {self.fragments} fragment(s), copied {self.entries} entries; " if self.fragments else ""
            return (f"ledger {self.ledger_id}: {moved}its last fragment left for now: OPEN and its writer is alive; "
                    "it is moved once the writer changes ensemble, closes the ledger or dies (a repair now would "
                    "fence the writer)")
        recovered = ", recovered and closed first" if self.recovered else ""
        return (f"ledger {self.ledger_id}: moved {self.fragments} fragment(s), copied {self.entries} "
                f"entr{'y' if self.entries == 1 else 'ies'}{recovered}")


class Rereplicator:
    """Moves ledger fragments off lost nodes. passwords: those of the ledgers to repair (the metadata keeps
    only a hash; the nodes need the master key derived from the password)."""

    def __init__(self, client: LedgerClient, passwords: Sequence[bytes] = (b"",), *, timeout: float = 5.0,
                 add_timeout: float = 10.0, lost_after: float = 0.0):
        """lost_after: seconds a node must stay unregistered before its copies count as lost (Absences)."""
        self.client = client
        self._absences = Absences(lost_after, time.monotonic())
        self.store = client.store
        self._keys = {password_hash(p): p for p in passwords}
        self._runtime = Runtime.shared()
        self._ctx = Context(self.store, client.transport(), timeout, add_timeout)
        self.deferred: set[int] = set()   # ledgers the last repairs left to their live writers
        self.retrying: set[int] = set()   # ledgers whose repair failed: looked at again alone, not by a scan
        self._lost_nodes_read: tuple[float, dict, set] | None = None   # (when, registered, decommissioned)

    def __enter__(self) -> "Rereplicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._runtime.run(self._ctx.transport.close())

    # -- audit ---------------------------------------------------------------------------------------------------

    def nodes_now(self) -> tuple[frozenset[tuple[str, int, bool]], frozenset[str], frozenset[str]]:
        """The registered nodes with their process ids and whether they are broken, the decommissioned ones, and
        the absences past lost_after (AuditSchedule: each is a change of the nodes)."""
        registered, now = registry.list_nodes(self.store), time.monotonic()
        self._absences.update(registered, now)
        return (frozenset((node, reg.pid, reg.broken) for node, reg in registered.items()),
                frozenset(registry.decommissioned_nodes(self.store)), self._absences.expired(now))

    def audit(self, nodes: tuple[frozenset[tuple[str, int, bool]], frozenset[str], frozenset[str]] | None = None
              ) -> list[LedgerAudit]:
        """Every ledger with a fragment on a node that is gone (not registered for lost_after seconds), broken or
        decommissioned; nodes: as nodes_now() read them just before (the auditor's round), else read here."""
        registered, retired, _ = nodes if nodes is not None else self.nodes_now()
        broken = {node for node, _, is_broken in registered if is_broken}
        registered = {node for node, _, _ in registered}
        found, now = [], time.monotonic()
        for current in self.store.iter_ledgers():
            meta = current.value
            present = registered | {n for n in meta.all_nodes() if self._absences.excused(n, now)}
            reasons = lost_nodes(meta.all_nodes(), present, retired, broken)
            if reasons:
                found.append(LedgerAudit(meta, tuple(fragments_to_repair(meta, reasons)), reasons))
        return found

    def repair(self, audits: Iterable[LedgerAudit], on_ledger: Callable[[LedgerRepair], None] = lambda _: None
               ) -> list[LedgerRepair]:
        """Re-replicate what audit() found; the lost nodes are re-checked per ledger, as they may be back.
        on_ledger gets each ledger's outcome as soon as it is known (an auditor logs it then). A ledger whose
        repair fails is kept in `retrying`, for repair_deferred."""
        return self._repair_each([audit.meta.ledger_id for audit in audits], on_ledger)

    @property
    def pending(self) -> set[int]:
        """The ledgers to look at again alone: deferred to their live writers, or whose repair failed."""
        return self.deferred | self.retrying

    def repair_deferred(self, on_ledger: Callable[[LedgerRepair], None] = lambda _: None) -> list[LedgerRepair]:
        """Look again at the pending ledgers (a read of each, not a scan): those deferred to their live writers
        are repaired once closed or dangling; each leaves the set once repaired or deleted; one whose repair failed
        stays, to be tried again in the next round. So one ledger no repair can fix (its password not given, no
        replica left to copy from) costs a read per round, not a scan of every ledger."""
        return self._repair_each(sorted(self.pending), on_ledger)

    def _repair_each(self, ledger_ids: list[int], on_ledger: Callable[[LedgerRepair], None]) -> list[LedgerRepair]:
        outcomes = []
        self._lost_nodes_read = None   # each round reads the nodes afresh (then at most every NODES_READ_SECONDS)
        for ledger_id in ledger_ids:
            outcome = self.repair_ledger(ledger_id, self._lost_now, fence_live_writer=False)
            (self.deferred.add if outcome.deferred else self.deferred.discard)(ledger_id)
            (self.retrying.add if not outcome.ok and not outcome.deferred else self.retrying.discard)(ledger_id)
            outcomes.append(outcome)
            on_ledger(outcome)
        return outcomes

    def _lost_now(self, nodes: Iterable[str]) -> set[str]:
        """Those of the nodes that are gone or decommissioned now: the node registry is read again at most every
        NODES_READ_SECONDS (a node may come back while a long repair runs), not for every ledger repaired: a read
        of it costs one read per registered node."""
        now = time.monotonic()
        if self._lost_nodes_read is None or now - self._lost_nodes_read[0] >= NODES_READ_SECONDS:
            self._lost_nodes_read = (now, registry.list_nodes(self.store), registry.decommissioned_nodes(self.store))
            self._absences.update(self._lost_nodes_read[1], now)   # a node that left since the round began
        _, registered, retired = self._lost_nodes_read
        present = set(registered) | {node for node in nodes if self._absences.excused(node, now)}
        return set(lost_nodes(nodes, present, retired, {node for node, reg in registered.items() if reg.broken}))

    # -- decommission --------------------------------------------------------------------------------------------

    def decommission(self, node_id: str, on_ledger: Callable[[LedgerRepair], None] = lambda _: None
                     ) -> list[LedgerRepair]:
        """Retire node_id: mark it decommissioned first, so that no new ensemble or replacement picks it while
        it drains, then move every fragment it holds. Returns the outcome per ledger; the node holds nothing
        any more when every outcome is ok: a write naming nodes chosen before the mark (a creation, an ensemble
        change, a repair) checks the placement epoch the mark advanced and is refused (registry.Placement), so a
        scan that finds no ledger naming the node is final."""
        if (node_id not in registry.list_nodes(self.store) and registry.read_cookie(self.store, node_id) is None
                and not any(node_id in c.value.all_nodes() for c in self.store.iter_ledgers())):
            raise ReplicationError(f"node {node_id} is unknown: not registered, no cookie, in no ledger; check the "
                                   "node id (`ledger cluster status` lists the nodes)")
        registry.mark_decommissioned(self.store, node_id)
        outcomes: dict[int, LedgerRepair] = {}
        for _ in range(DECOMMISSION_PASSES):
            given_up = {o.ledger_id for o in outcomes.values() if not o.ok}
            todo = [c.value.ledger_id for c in self.store.iter_ledgers()
                    if node_id in c.value.all_nodes() and c.value.ledger_id not in given_up]
            if not todo:
                break
            for ledger_id in todo:
                outcomes[ledger_id] = self.repair_ledger(ledger_id, lambda nodes: {node_id} & set(nodes))
                on_ledger(outcomes[ledger_id])
        return sorted(outcomes.values(), key=lambda o: o.ledger_id)

    # -- one ledger ----------------------------------------------------------------------------------------------

    def repair_ledger(self, ledger_id: int, lost: Callable[[Iterable[str]], set[str]], *,
                      fence_live_writer: bool = True) -> LedgerRepair:
        """Move every fragment of the ledger off the nodes lost(ensemble) names, fragment by fragment. An OPEN
        ledger is recovered first; unless fence_live_writer, one whose writer is alive is not: the fragments its
        ensemble changes ended are moved, and its last one, if it names a lost node, is deferred."""
        fragments = entries = replans = 0
        recovered = live = False
        try:
            meta = self.store.read_ledger(ledger_id).value
            password = self._keys.get(meta.password_hash)
            if password is None:
                return LedgerRepair(ledger_id, error="none of the given passwords is this ledger's; rerun with "
                                                     "--password set to the password it was created with")
            if not fragments_to_repair(meta, lost(meta.all_nodes())):
                return LedgerRepair(ledger_id)   # the lost nodes are back
            if not meta.is_closed:
                # IN_RECOVERY: its writer is fenced and can never close it; a recovery that gave up is finished here.
                live = (not fence_live_writer and meta.state is LedgerState.OPEN
                        and not self.client.is_dangling(meta))
                if not live:
                    self.client.recover_ledger_with_retry(ledger_id, password)
                    recovered = True
            while True:
                meta = self.store.read_ledger(ledger_id).value
                repairs = fragments_to_repair(meta, lost(meta.all_nodes()))
                copyable = [repair for repair in repairs if repair.closed]   # all of them once the ledger is closed
                if not copyable:
                    return LedgerRepair(ledger_id, fragments, entries, recovered, deferred=live and bool(repairs))
                try:
                    entries += self._repair_fragment(meta, copyable[0], master_key(password))
                    fragments += 1
                except ReplicationConflictError:
                    replans += 1
                    if replans >= MAX_REPLANS:
                        raise
        except NoSuchLedgerError:
            return LedgerRepair(ledger_id, fragments, entries, recovered)  # deleted meanwhile: nothing to keep
        except LedgerError as exc:
            return LedgerRepair(ledger_id, fragments, entries, recovered, error=str(exc))

    def _repair_fragment(self, meta: LedgerMetadata, repair: FragmentRepair, key: bytes) -> int:
        """Copy the fragment to replacements (another one if a replacement fails), then CAS; entries copied."""
        failed: set[str] = set()
        placement = registry.placement(self.store)
        for _ in range(MAX_REPLACEMENTS):
            new_ensemble = choose_replacements(repair, placement.nodes, exclude=failed)
            copies = plan_copies(repair, schedule_of(meta), new_ensemble)
            try:
                self._runtime.run(self._copy(meta.ledger_id, copies, key))
            except ReplicaWriteError as exc:
                failed.add(exc.node)
                continue
            # The CAS checks the epoch the replacements were chosen at: a node decommissioned since (a
            # decommission that already found no ledger naming it) must not be named now.
            while True:
                try:
                    update_ledger(self.store, meta.ledger_id, replace_in_fragment(repair, new_ensemble),
                                  placement_epoch=placement.epoch)
                    return len(copies)
                except PlacementChangedError:
                    placement = registry.placement(self.store)
                    if not set(new_ensemble) - set(repair.ensemble) <= set(placement.nodes):
                        break       # a replacement was decommissioned: copy to others
        raise ReplicationError(
            f"ledger {meta.ledger_id}: no replacement node took the copies of {repair.describe()} (tried "
            f"{', '.join(sorted(failed))}; writable now: {', '.join(writable(placement.nodes, failed)) or 'none'}); "
            "check the nodes and retry")

    # -- copying (on the runtime's loop) -------------------------------------------------------------------------

    async def _copy(self, ledger_id: int, copies: list[EntryCopy], key: bytes) -> None:
        for start in range(0, len(copies), BATCH_ENTRIES):
            batch = copies[start:start + BATCH_ENTRIES]
            entries = await self._read(ledger_id, batch)
            await self._write(ledger_id, batch, entries, key)

    async def _read(self, ledger_id: int, batch: list[EntryCopy]) -> dict[int, pb.ReadResponse]:
        reads = CopyReads(ledger_id, batch)

        async def range_call(call) -> None:
            end = await read_range(self._ctx, ledger_id, call, reads.on_entry)
            reads.on_call_done(call, end.reason)

        while not reads.done:
            await asyncio.gather(*(range_call(call) for call in reads.calls()))
        error = reads.error()
        if error is not None:
            raise error
        return reads.entries

    async def _write(self, ledger_id: int, batch: list[EntryCopy], entries: dict[int, pb.ReadResponse],
                     key: bytes) -> None:
        writes = CopyWrites(ledger_id, batch)
        settled = asyncio.Event()
        sink = _CopySink(writes, settled)
        transport = self._ctx.transport
        transport.register(ledger_id, True, sink)
        try:
            per_node: dict[str, list[bytes]] = {}
            for copy in batch:
                original = entries[copy.entry_id]
                add = wire.add_request(ledger_id, copy.entry_id, key, pb.RECOVERY_ADD, original.last_add_confirmed,
                                       original.digest, original.payload)
                for node in copy.targets:
                    per_node.setdefault(node, []).append(add)
            for node, adds in per_node.items():
                transport.send_adds(node, True, adds)
            try:
                await asyncio.wait_for(settled.wait(), self._ctx.add_timeout)
            except asyncio.TimeoutError:
                for _, node in sorted(writes.waiting):
                    writes.on_node_failure(node, "copies not acknowledged in time")
        finally:
            transport.unregister(ledger_id, True)
        if writes.failure is not None:
            raise writes.failure


class _CopySink:
    """Routes the transport's add results for one ledger's copies into CopyWrites (runner.AddPipeline's role)."""

    def __init__(self, writes: CopyWrites, settled: asyncio.Event):
        self._writes = writes
        self._settled = settled

    def on_add_result(self, node: str, result: pb.AddResult) -> None:
        self._writes.on_result(node, result.entry_id, result.status, result.message)
        self._check()

    def on_add_range(self, node: str, first: int, last: int, status: int, message: str) -> None:
        # on_result for each id in turn; only the copies still waiting for this node can be answered
        for entry_id in sorted(e for e, n in self._writes.waiting if n == node and first <= e <= last):
            self._writes.on_result(node, entry_id, status, message)
        self._check()

    def on_node_failure(self, node: str, reason: str) -> None:
        self._writes.on_node_failure(node, reason)
        self._check()

    def _check(self) -> None:
        if self._writes.done:
            self._settled.set()
