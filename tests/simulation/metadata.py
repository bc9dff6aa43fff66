"""The metadata store of a simulation: versioned ledger records with compare-and-set, in memory.

It also watches the first invariant that is about metadata alone: a CLOSED ledger never changes.
"""
from __future__ import annotations

from metadata.errors import MetadataConflictError, NoSuchLedgerError
from metadata.model import LedgerMetadata, LedgerState, Versioned


class InMemoryStore:
    def __init__(self, trace) -> None:
        self._ledgers: dict[int, Versioned[LedgerMetadata]] = {}
        self._next_id = 0
        self._trace = trace
        self.violations: list[str] = []

    def create_ledger(self, meta: LedgerMetadata, placement_epoch: int | None = None) -> Versioned[LedgerMetadata]:
        meta = meta.replace(ledger_id=self._next_id)
        self._next_id += 1
        self._ledgers[meta.ledger_id] = Versioned(meta, 0)
        return self._ledgers[meta.ledger_id]

    def read_ledger(self, ledger_id: int) -> Versioned[LedgerMetadata]:
        if ledger_id not in self._ledgers:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        return self._ledgers[ledger_id]

    def write_ledger(self, meta: LedgerMetadata, expected_version: int,
                     placement_epoch: int | None = None) -> Versioned[LedgerMetadata]:
        stored = self.read_ledger(meta.ledger_id)
        if stored.version != expected_version:
            raise MetadataConflictError(f"ledger {meta.ledger_id} changed (version {stored.version})")
        before = stored.value
        if before.state is LedgerState.CLOSED and (
                meta.state, meta.last_entry_id, meta.fragments) != (before.state, before.last_entry_id, before.fragments):
            self.violations.append(f"closed ledger {meta.ledger_id} changed: {_describe(before)} -> {_describe(meta)}")
        self._trace(f"metadata ledger {meta.ledger_id} v{expected_version + 1}: {_describe(meta)}")
        self._ledgers[meta.ledger_id] = Versioned(meta, expected_version + 1)
        return self._ledgers[meta.ledger_id]


def _describe(meta: LedgerMetadata) -> str:
    fragments = " ".join(f"{f.first_entry_id}:{''.join(f.ensemble)}" for f in meta.fragments)
    return f"{meta.state.value} last={meta.last_entry_id} fragments=[{fragments}]"
