"""Reads around a node that does not answer (SIGSTOP, a long GC pause): they start at the node of their entry,
ask another replica when the chosen node has not answered within the speculative timeout, and ask nodes that
failed the client recently last, for a while (BookKeeper's speculative reads and slow-bookie avoidance). The
client's speculative timeout is its default.

Audit 2026-11-29, finding 2: every single-entry read started at the first node of the ensemble and waited the full
per-answer timeout for it when it was paused (a binary search's 10 reads: 0.1 s, 50 s with that node paused);
a 30,000-entry read took 0.41 s with all nodes up, 22 s with one paused. The reader here has a 60 s per-answer
timeout: a read that waited for the paused node would not finish within the deadlines below.
"""
from __future__ import annotations

import concurrent.futures

from connector.client import LedgerClient
from tests.harness.observed_transport import ObservedClient, observed

READER_TIMEOUT = 60.0
DEADLINE = 20.0   # for a read that does not wait for the paused node; one that does waits READER_TIMEOUT
PROBES = (500, 250, 125, 62, 31, 15, 7, 3, 1, 0)   # a binary search's single-entry reads


def _closed_ledger(uri: str, entries: int) -> tuple[int, tuple[str, ...], list[bytes]]:
    payloads = [b"entry-%d" % i for i in range(entries)]
    with LedgerClient(uri) as writer:
        handle = writer.create_ledger(3, 3, 2)
        for start in range(0, entries, 1000):
            handle.append_many(payloads[start:start + 1000])
        meta = handle.close()
    return meta.ledger_id, meta.last_fragment.ensemble, payloads


def test_single_entry_reads_do_not_wait_for_a_paused_node_and_avoid_it_after_its_first_miss(cluster, metadata_uri):
    nodes = {n.node_id: n for n in cluster(3)}
    ledger_id, ensemble, payloads = _closed_ledger(metadata_uri, 1000)
    paused = ensemble[0]   # the node every single-entry read started at before
    with ObservedClient(metadata_uri, timeout=READER_TIMEOUT) as reader, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        handle = reader.open_ledger(ledger_id)
        nodes[paused].pause()
        try:
            for entry_id in PROBES:
                read = pool.submit(lambda: [e.payload for e in handle.read(entry_id, entry_id)])
                assert read.result(DEADLINE) == [payloads[entry_id]]
        finally:
            nodes[paused].resume()
        asked = {node: observed(reader).made[node, "ReadRange"] for node in ensemble}
    assert asked[paused] <= 1, f"range reads per node with {paused} paused: {asked}"


def test_a_range_read_with_a_paused_node_asks_the_other_replicas(cluster, metadata_uri):
    nodes = {n.node_id: n for n in cluster(3)}
    ledger_id, ensemble, payloads = _closed_ledger(metadata_uri, 10_000)
    with LedgerClient(metadata_uri, timeout=READER_TIMEOUT) as reader, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        handle = reader.open_ledger(ledger_id)
        for paused in ensemble[:2]:   # once with no failure remembered yet, once with the other node's remembered
            nodes[paused].pause()
            try:
                read = pool.submit(lambda: [e.payload for e in handle.read()])
                assert read.result(DEADLINE) == payloads   # every entry, digest verified
            finally:
                nodes[paused].resume()
