"""Entries with known payloads, and the check that every one of them reads back byte-identical."""
from __future__ import annotations

import random

from connector.client import LedgerClient


def append_entries(writer, count: int, seed: int) -> dict[int, bytes]:
    """count random payloads of 1 byte..4 KiB (pipelined); entry id -> payload once all are acknowledged."""
    rng = random.Random(seed)
    payloads = [rng.randbytes(rng.randint(1, 4096)) for _ in range(count)]
    futures = [writer.append_async(p) for p in payloads]
    return {future.result(): payload for future, payload in zip(futures, payloads)}


def assert_every_entry_reads_back(client: LedgerClient, expected: dict[int, tuple[bytes, dict[int, bytes]]]) -> None:
    """expected: ledger id -> (password, entry id -> payload). The ledgers must be closed at their last entry."""
    for ledger_id, (password, entries) in expected.items():
        reader = client.open_ledger(ledger_id, password=password)
        assert reader.last_entry_id == max(entries), f"ledger {ledger_id} ends at {reader.last_entry_id}"
        stored = {e.entry_id: e.payload for e in reader.read()}
        assert stored == entries, f"ledger {ledger_id} does not read back byte-identical"
