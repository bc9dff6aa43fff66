"""The invariants checked after every schedule (DESIGN section 7), each an independent reading of what
happened: the writer's acknowledgements, every close that returned, and the entries read back.

1. Acknowledgements come in entry order, without gaps (rule 2).
2. Every entry acknowledged to the writer is in the closed ledger (rule 13: no truncation); in particular
   none was acknowledged past the point where recovery closed it (fencing, rules 6 and 10).
3. Every close that returned (the writer's, every recovery's) agrees on last_entry_id (rule 12).
4. A closed ledger never changes (checked by the in-memory store on every write).
5. Every entry of the closed ledger reads back with the payload the writer sent (rules 1, 11, 12).
6. An idle writer's LAC reaches every node of its ensemble soon after the faults heal (rules 2, 17;
   checked by the writer in schedule.py, which is the only one to know when it went idle).
7. No node holds a LAC beyond the closed ledger's last entry: a LAC covers acknowledged entries only (rule 2),
   and every acknowledged entry is in the closed ledger (2. above).
"""
from __future__ import annotations

from connector.client.errors import LedgerError
from connector.client.ops.read import plan_chunks
from connector.client.runner import read_chunk
from metadata.model import LedgerMetadata, LedgerState


def check(scenario, ledger_id: int, final: LedgerMetadata) -> list[str]:
    violations = []
    acked = [entry_id for entry_id, _ in scenario.acks]
    if acked != list(range(len(acked))):
        violations.append(f"acknowledgements out of order or with gaps: {acked}")
    if final.state is not LedgerState.CLOSED:
        violations.append(f"the last recovery returned ledger {ledger_id} in state {final.state.value}")
    for entry_id, when in scenario.acks:
        if entry_id > final.last_entry_id:
            violations.append(f"truncation: entry {entry_id} was acknowledged to the writer at {when:.4f}, "
                              f"but the ledger closed at {final.last_entry_id}")
    for node_id, node in sorted(scenario.network.nodes.items()):
        if node.lac.get(ledger_id, -1) > final.last_entry_id:
            violations.append(f"LAC beyond the end: node {node_id} holds LAC {node.lac[ledger_id]}, the ledger "
                              f"closed at {final.last_entry_id}")
    for who, last in scenario.closes:
        if last != final.last_entry_id:
            violations.append(f"disagreement: {who} closed the ledger at {last}, the stored close is at "
                              f"{final.last_entry_id}")
    return violations


async def read_back(scenario, ledger_id: int) -> list[str]:
    meta = scenario.store.read_ledger(ledger_id).value
    if meta.last_entry_id < 0:
        return []
    ctx = scenario.context("reader")
    violations = []
    for chunk in plan_chunks(meta, 0, meta.last_entry_id, 8):
        try:
            entries = await read_chunk(ctx, chunk)
        except LedgerError as exc:
            violations.append(f"entries {chunk.first}..{chunk.last} of the closed ledger cannot be read: {exc}")
            continue
        for entry in entries:
            if entry.payload != scenario.payload(entry.entry_id):
                violations.append(f"entry {entry.entry_id} reads back {entry.payload!r}, the writer sent "
                                  f"{scenario.payload(entry.entry_id)!r}")
    return violations
