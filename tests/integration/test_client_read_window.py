"""A read of a ledger whose metadata does not give its length (closed by recovery: -1; OPEN: 0) holds about as
much as one of a ledger its writer closed: its chunks are sized from the entries received.

Audit 2026-11-29, finding 1: such a read assumed 4 KiB entries, so a chunk was 1024 entries and up to 2E chunks
were in flight; with 256 KiB entries a recovered ledger's read peaked at 921 MiB RSS, 137 MiB for the same data
closed by its writer. Measured here without RSS: what the read asked the nodes for, ahead of what it handed
out (the bytes a reader holds at most), from the chunks it submitted (runner.read_chunk, observed).
"""
from __future__ import annotations

import os

import pytest

import connector.client.runner as runner
from connector.client import LedgerClient
from connector.client.ops.read import CHUNK_BYTES

ENTRY_BYTES = 256 * 1024
ENTRIES = 200   # 50 MiB: one chunk of all of them before the fix


@pytest.fixture
def submitted(monkeypatch):
    """(first, last) of every chunk the reads submit, in order."""
    chunks: list[tuple[int, int]] = []
    read_chunk = runner.read_chunk

    def observed(ctx, chunk):
        chunks.append((chunk.first, chunk.last))
        return read_chunk(ctx, chunk)

    monkeypatch.setattr(runner, "read_chunk", observed)
    return chunks


def test_a_recovered_ledger_of_large_entries_is_read_holding_a_few_chunks(cluster, metadata_uri, submitted):
    cluster(3)
    payloads = [os.urandom(64) * (ENTRY_BYTES // 64) for _ in range(4)]
    with LedgerClient(metadata_uri) as writer, LedgerClient(metadata_uri) as reader:
        handle = writer.create_ledger(3, 3, 2)
        for future in [handle.append_async(payloads[i % 4]) for i in range(ENTRIES)]:
            future.result(60)
        meta = reader.recover_ledger(handle.ledger_id)   # the writer never closes it: the length is unknown
        assert (meta.last_entry_id, meta.length) == (ENTRIES - 1, -1)

        read, most_ahead = reader.open_ledger(handle.ledger_id).read(), 0
        for entry in read:
            assert entry.payload == payloads[entry.entry_id % 4]
            # asked for, not handed out yet: what the reader holds or has in flight
            most_ahead = max(most_ahead, (submitted[-1][1] - entry.entry_id + 1) * ENTRY_BYTES)
        assert entry.entry_id == ENTRIES - 1

    in_flight = 2 * meta.ensemble_size
    assert max((last - first + 1) * ENTRY_BYTES for first, last in submitted) <= CHUNK_BYTES
    assert most_ahead <= (in_flight + 1) * CHUNK_BYTES, f"{most_ahead / 2**20:.0f} MiB asked for ahead of the reader"
