"""The soak's check of every copy: each entry of a closed ledger, up to its close, read from every node of its
fragment's ensemble (one ReadRange per fragment and node) and compared, copy with copy. A ledger read takes each
entry from one replica, so copies that disagree between nodes would pass it unseen.

- divergent: two copies of one entry with different payloads, or a copy whose digest does not verify (a damaged
  copy). Digests themselves may differ between good copies: a recovery writes an entry back with the LAC it
  started from, and the digest covers the piggybacked LAC; so each copy is verified against its own LAC and the
  payloads are compared.
- under-replicated (a violation): an entry with fewer good copies on its write set than the ack quorum. An
  append is acknowledged by AQ nodes of its write set and a recovery writes an entry back to AQ of them, the
  nemesis destroys no data, and a repair only adds copies: nothing accounts for fewer.
- missing copies (a figure, not a violation): a node of an entry's write set without it, while AQ or more have
  it. With AQ < WQ an append is acknowledged without the last WQ - AQ copies, and a writer's ensemble change moves
  only the entries after its LAC: the copies a failed node never took stay missing (BookKeeper's design: the
  auditor repairs the fragments of lost nodes, not copies a live node lacks).

Copies on a node that did not answer its read in full (a broken call, an error status) are unread: counted
apart, and they do not count as good copies; an entry that reaches AQ only with its unread copies is unverified
(a figure: that node's failure to answer is not a lost copy, and a heal that gave up is reported already), below
AQ even with them it is under-replicated. The cost is one read of every copy of the history's closed ledgers,
which the soak's minutes bound (about 3 x 1 KiB per acknowledged append).
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib

from connector.client.errors import LedgerError, answered
from connector.client.ops.read import RangeCall, entry_problem
from connector.client.runner import Context, read_range, schedule_of
from connector.client.runner.read import RangeEnd
from metadata.model import LedgerMetadata
from protos import ledger_pb2 as pb


@dataclasses.dataclass
class NodeCopies:
    """What one node returned for a ledger's entries it was asked for: entry id -> the payload's hash, or why
    the copy is bad ("!" + the problem: a digest mismatch, an error status). unread: (first, last, why) of each
    read that did not complete, whose entries not returned are unread, not missing."""

    copies: dict[int, str] = dataclasses.field(default_factory=dict)
    unread: list[tuple[int, int, str]] = dataclasses.field(default_factory=list)

    def lacking(self, entry_id: int) -> str:
        """Why the node has no copy of entry_id: it is missing, or a read that did not complete did not return it."""
        for first, last, why in self.unread:
            if first <= entry_id <= last:
                return f"unread: {why}"
        return "missing"


@dataclasses.dataclass
class ReplicaFigures:
    entries: int = 0           # entries compared
    copies: int = 0            # good copies found on their write sets
    missing: int = 0           # copies a node of the write set does not hold (the node answered in full)
    unread: int = 0            # copies on a node of the write set that did not answer in full
    short_entries: int = 0     # entries with a copy missing or unread (yet AQ or more good ones)
    unverified: int = 0        # entries with fewer than AQ good copies but AQ or more with the unread ones

    def add(self, other: "ReplicaFigures") -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def line(self) -> str:
        unread = f", {self.unread} unread" if self.unread else ""
        unread += (f"; {self.unverified} entries not verified: fewer than AQ good copies read, a node holding "
                   "others did not answer" if self.unverified else "")
        return (f"copies compared {self.copies} of {self.entries} entries on every node of their write sets, "
                f"entries short of a copy {self.short_entries} ({self.missing} copies missing{unread}; each entry "
                "still on AQ nodes or more)")


def payload_hash(payload: bytes | memoryview) -> str:
    return hashlib.blake2b(payload, digest_size=8).hexdigest()


async def read_copies(ctx: Context, meta: LedgerMetadata) -> dict[str, NodeCopies]:
    """Every copy of a closed ledger's entries 0..last held by the nodes of their fragments' ensembles (the
    nodes' calls at once), by node."""
    found: dict[str, NodeCopies] = {}

    def on_entry(node: str, response) -> None:
        if response.entry_id <= meta.last_entry_id:
            payload = response.payload
            problem = entry_problem(meta.ledger_id, response, payload)
            found[node].copies[response.entry_id] = "!" + problem if problem else payload_hash(payload)

    async def read(call: RangeCall) -> None:
        try:
            end = await read_range(ctx, meta.ledger_id, call, on_entry)
        except LedgerError as exc:   # the node's address could not be found, say
            end = RangeEnd(pb.STATUS_UNKNOWN, str(exc))
        if not answered(end.status):   # a negative is a complete answer: the node holds none of the range
            found[call.node].unread.append((call.first_entry_id, call.last_entry_id, end.reason))

    calls = [RangeCall(node, first, min(last, meta.last_entry_id))
             for first, last, fragment in meta.fragment_ranges() if first <= min(last, meta.last_entry_id)
             for node in dict.fromkeys(fragment.ensemble)]
    for call in calls:
        found.setdefault(call.node, NodeCopies())
    await asyncio.gather(*(read(call) for call in calls))
    return found


@dataclasses.dataclass
class Verdict:
    """What judge found in one closed ledger's copies (the checker words the violations)."""

    figures: ReplicaFigures = dataclasses.field(default_factory=ReplicaFigures)
    damaged: list[tuple[int, str, str]] = dataclasses.field(default_factory=list)   # (entry, node, problem)
    differing: list[tuple[int, dict[str, str]]] = dataclasses.field(default_factory=list)  # (entry, node -> hash)
    below_quorum: list[int] = dataclasses.field(default_factory=list)   # entries with fewer than AQ good copies
    lacking: dict[str, str] = dataclasses.field(default_factory=dict)   # node -> why it lacks some of those


def judge(meta: LedgerMetadata, found: dict[str, NodeCopies]) -> Verdict:
    """A closed ledger's copies as read_copies found them, entry by entry (see the module)."""
    schedule = schedule_of(meta)
    verdict = Verdict()
    figures = verdict.figures
    nothing = NodeCopies(unread=[(0, meta.last_entry_id, "not read")])
    for first, last, fragment in meta.fragment_ranges():
        for entry_id in range(first, min(last, meta.last_entry_id) + 1):
            write_set = schedule.write_set_nodes(entry_id, fragment.ensemble)
            good: dict[str, str] = {}
            lacking: dict[str, str] = {}
            for node in dict.fromkeys(fragment.ensemble):   # a copy off the write set is compared too
                held = found.get(node, nothing)
                copy = held.copies.get(entry_id)
                if copy is not None and copy.startswith("!"):
                    verdict.damaged.append((entry_id, node, copy[1:]))
                elif copy is not None:
                    good[node] = copy
                elif node in write_set:
                    lacking[node] = held.lacking(entry_id)
            if len(set(good.values())) > 1:
                verdict.differing.append((entry_id, good))
            held_by = sum(1 for node in good if node in write_set)
            unread = sum(1 for why in lacking.values() if why != "missing")
            figures.entries += 1
            figures.copies += held_by
            figures.missing += len(lacking) - unread
            figures.unread += unread
            if held_by + unread < meta.ack_quorum:
                verdict.below_quorum.append(entry_id)
                verdict.lacking.update(lacking)
            elif held_by < meta.ack_quorum:
                figures.unverified += 1   # AQ copies only with those that could not be read: not known either way
            elif lacking:
                figures.short_entries += 1
    return verdict
