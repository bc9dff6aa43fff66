"""The long poll of a tailing reader (ReadHandle.wait_lac) against real nodes: a paused node does not hold it past
its timeout, and a wait longer than a node's longest (protos.limits.MAX_WAIT_LAC_MS) waits instead of returning at
once (audit 2026-11-29, findings 4 and 5)."""
from __future__ import annotations

import concurrent.futures

from connector.client import LedgerClient
from protos.limits import MAX_WAIT_LAC_MS
from tests.harness.observed_transport import ObservedClient, observed
from tests.harness.poll import poll_until

READER_TIMEOUT = 30.0   # per answer: a poll that waited for the paused node would take this long more
ENTRIES = 5


def _tailed_ledger(writer: LedgerClient, reader: LedgerClient):
    """An OPEN ledger of ENTRIES entries whose LAC the nodes know (the writer idles), and a reader's handle at it."""
    handle = writer.create_ledger(3, 3, 2)
    handle.append_many([b"entry-%d" % i for i in range(ENTRIES)])
    tail = reader.open_ledger(handle.ledger_id, recover=False)
    poll_until(lambda: tail.read_lac() == ENTRIES - 1, 30, what="every node to hold the writer's LAC")
    return handle, tail


def test_a_paused_node_does_not_hold_a_long_poll_past_its_timeout(cluster, metadata_uri):
    """The poll waited for every node's answer: with one paused, 0.5 s became the per-answer timeout more."""
    nodes = {n.node_id: n for n in cluster(3)}
    with LedgerClient(metadata_uri) as writer, LedgerClient(metadata_uri, timeout=READER_TIMEOUT) as reader, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        handle, tail = _tailed_ledger(writer, reader)
        paused = handle.metadata.last_fragment.ensemble[0]
        nodes[paused].pause()
        try:
            poll = pool.submit(tail.wait_lac, ENTRIES - 1, 0.5)
            assert poll.result(READER_TIMEOUT / 3) == ENTRIES - 1   # no news, from the other two nodes
        finally:
            nodes[paused].resume()
        handle.close()


def test_a_wait_longer_than_a_nodes_longest_waits_for_the_next_entry(cluster, metadata_uri):
    """Every node answered BAD_REQUEST to a timeout over MAX_WAIT_LAC_MS and the client took that as "no news": a
    wait_lac(timeout=200) returned at once."""
    cluster(3)
    with LedgerClient(metadata_uri) as writer, ObservedClient(metadata_uri) as reader, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        handle, tail = _tailed_ledger(writer, reader)
        ensemble = handle.metadata.last_fragment.ensemble
        transport = observed(reader)
        poll = pool.submit(tail.wait_lac, ENTRIES - 1, 2 * MAX_WAIT_LAC_MS / 1000)
        poll_until(lambda: poll.done() or all(transport.in_flight[n, "WaitLac"] for n in ensemble), 30,
                   what="the long poll in flight on every node")
        assert not poll.done(), f"the poll returned {poll.result()} before anything was appended"
        assert handle.append(b"next") == ENTRIES
        assert poll.result(30) == ENTRIES
        asked = [request.timeout_ms for _, method, request in transport.requests if method == "WaitLac"]
        assert asked and max(asked) <= MAX_WAIT_LAC_MS
        handle.close()
