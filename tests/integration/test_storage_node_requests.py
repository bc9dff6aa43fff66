"""Requests a real node must survive or serve: malformed and oversized input, read-only mode, group
commit and the LAC long poll."""
from __future__ import annotations

import concurrent.futures

import pytest

from metadata import layout, serde
from metadata.model import NodeState
from protos import ledger_pb2 as pb
from tests.harness.node_client import NodeClient, make_entry, payload_for
from tests.harness.poll import poll_until

# Driven with fixed ledger ids that have no metadata: the nodes bind master keys unchecked
# (--bind-keys-unchecked; the check itself: tests/security/test_ledger_claims.py).
pytestmark = pytest.mark.keys_unchecked


def test_malformed_and_damaged_requests_get_bad_request_oversized_entries_too_large_and_the_node_keeps_serving(
        start_node):
    node = start_node(None, "--max-entry-bytes", "1024")
    with NodeClient(node.address) as client:
        bad = client.add(
            make_entry(1, 0, b"x" * 1025),
            make_entry(1, 1, b"fine", digest=12345),
            make_entry(1, -5, b"negative id"),
            make_entry(1, 2, b"no key", key=b""),
            make_entry(1, 3, b"future lac", lac=7),
            make_entry(-1, 0, b"negative ledger"),
        )
        assert [r.status for r in bad] == [pb.TOO_LARGE] + [pb.BAD_REQUEST] * 5
        assert "limit of 1024 bytes" in bad[0].message and "digest mismatch" in bad[1].message
        mixed = client.add(make_entry(1, 0, b"x" * 1024), make_entry(1, 1, b"y", digest=1))
        assert [r.status for r in mixed] == [pb.OK, pb.BAD_REQUEST]
        assert client.raw("Read", b"\xff\xff\xff\xff", pb.ReadResponse).status == pb.BAD_REQUEST
        assert client.raw("ReadLac", b"\x08", pb.ReadLacResponse).status == pb.BAD_REQUEST
        [garbage] = client.raw_add([b"\x0a\xff\xff\xff"])
        assert [r.status for r in garbage.results] == [pb.BAD_REQUEST]
        assert client.read(1, 0, fence=True, key=b"").status == pb.BAD_REQUEST
        assert client.read_range(1, 5, 2)[0].status == pb.BAD_REQUEST
        assert client.wait_lac(1, 0, -1).status == pb.BAD_REQUEST
        assert client.read(1, 0).payload == b"x" * 1024
        assert client.add(make_entry(1, 2, b"still serving"))[0].status == pb.OK
    assert node.process.poll() is None


def test_read_only_node_refuses_normal_adds_but_serves_reads_and_recovery_adds(start_node, store):
    node = start_node(None, "--read-only-threshold", "0.0001")
    with NodeClient(node.address) as client:
        refused = client.add(make_entry(1, 0, b"normal"))[0]
        assert refused.status == pb.READ_ONLY and "read-only" in refused.message
        assert client.write_lac(1, 0).status == pb.READ_ONLY
        assert client.add(make_entry(1, 0, b"recovered", recovery=True))[0].status == pb.OK
        assert client.read(1, 0).payload == b"recovered"
        info = client.node_info()
        assert info.read_only and "--read-only-threshold" in info.read_only_reason
    registration = store.read(layout.node_path(node.node_id), serde.decode_node)
    assert registration.value.state is NodeState.READ_ONLY
    assert registration.value.address == node.address


def test_drained_node_started_read_only_refuses_normal_adds(start_node, store):
    node = start_node(None, "--read-only")
    with NodeClient(node.address) as client:
        assert client.add(make_entry(1, 0, b"normal"))[0].status == pb.READ_ONLY
    assert store.read(layout.node_path(node.node_id), serde.decode_node).value.state is NodeState.READ_ONLY


def test_group_commit_makes_many_adds_share_an_fsync(start_node):
    node = start_node()
    streams, per_stream = 4, 150
    with NodeClient(node.address) as client:
        before = client.node_info()

        def one_entry_per_message(ledger_id: int) -> list[int]:
            batches = [[make_entry(ledger_id, e, payload_for(ledger_id, e, 2000))] for e in range(per_stream)]
            return [r.status for r in client.add_batches(batches).values()]

        with concurrent.futures.ThreadPoolExecutor(streams) as pool:
            statuses = [s for result in pool.map(one_entry_per_message, range(1, streams + 1)) for s in result]
        after = client.node_info()
    adds = streams * per_stream
    assert statuses == [pb.OK] * adds
    records = after.journal_records - before.journal_records
    fsyncs = after.journal_fsyncs - before.journal_fsyncs
    assert records == adds + streams            # every entry, plus one master key record per ledger
    assert 0 < fsyncs < adds


def test_wait_lac_answers_when_the_lac_advances_and_at_its_timeout(start_node):
    node = start_node()
    with NodeClient(node.address) as client:
        client.add(*[make_entry(4, e, b"e") for e in range(3)])          # LAC seen: 1
        waiting = client.wait_lac_future(4, previous_lac=1, timeout_ms=60_000)
        client.node_info()
        assert not waiting.done()
        client.add(make_entry(4, 3, b"e"))                                # piggybacks LAC 2
        answer = waiting.result(timeout=30)
        assert (answer.status, answer.last_add_confirmed, answer.last_entry_id) == (pb.OK, 2, 3)

        explicit = client.wait_lac_future(4, previous_lac=2, timeout_ms=60_000)
        assert client.write_lac(4, 3).status == pb.OK
        assert explicit.result(timeout=30).last_add_confirmed == 3

        timed_out = client.wait_lac(4, previous_lac=3, timeout_ms=200)
        assert (timed_out.status, timed_out.last_add_confirmed) == (pb.OK, 3)
        assert client.wait_lac(77, previous_lac=-1, timeout_ms=100).status == pb.NO_LEDGER
        poll_until(lambda: client.read_lac(4).last_add_confirmed == 3, 10, what="LAC to stay 3")
