"""Bounds on what callers can make a real node hold: calls and streams at once (--max-concurrent-rpcs), LAC long
polls at once (--max-lac-waiters), health Watch streams, which need no token (MAX_HEALTH_WATCHES), and the
master key's length (MAX_KEY_BYTES), kept in memory for every ledger a fence or an add names.

Security audit 2026-12: 20,000 WaitLac calls took a node from 62 to 312 MiB, 20,000 Health/Watch streams
without a token added 165 MiB, and 20,000 fences of never-seen ids with 1 KiB keys went through in 5.4 s."""
from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import ledger_pb2 as pb
from storage_node.service import MAX_HEALTH_WATCHES
from storage_node.storage import MAX_KEY_BYTES
from tests.harness.node_client import PASSWORD, NodeClient, given_ledgers, make_entry
from tests.harness.poll import poll_until

LONG_MS = 60_000


def test_lac_long_polls_and_calls_over_their_limits_are_refused_and_the_node_serves_on(start_node, store):
    given_ledgers(store, {1: PASSWORD})
    node = start_node(None, "--max-concurrent-rpcs", "30", "--max-lac-waiters", "10")
    with NodeClient(node.address) as client, grpc.insecure_channel(node.address) as other:
        calls = [client.wait_lac_future(10**12 + i, 0, LONG_MS) for i in range(11)]
        poll_until(lambda: any(call.done() for call in calls), 30, what="one long poll past the limit to be answered")
        [answer] = [call.result() for call in calls if call.done()]
        assert answer.status == pb.NO_LEDGER   # answered at once with what the node knows, as a long poll may end
        waiting = [call for call in calls if not call.done()]
        assert client.add(make_entry(1, 0, b"writers keep their room"))[0].status == pb.OK
        answer = client.wait_lac(1, -2, LONG_MS)    # one that need not wait is answered at the limit too
        assert (answer.status, answer.last_add_confirmed) == (pb.OK, -1)

        health = health_pb2_grpc.HealthStub(other)
        watches = [health.Watch(health_pb2.HealthCheckRequest()) for _ in range(20)]   # 10 + 20 = 30 calls open
        for watch in watches:
            next(watch)
        with pytest.raises(grpc.RpcError) as refusal:
            client.node_info()
        assert refusal.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        for call in (*watches, *waiting):
            call.cancel()
        poll_until(lambda: _serves(client), 30, what="the node to take calls again")
    assert node.process.poll() is None


def _serves(client: NodeClient) -> bool:
    try:
        return bool(client.node_info().node_id)
    except grpc.RpcError:
        return False


def test_health_watch_streams_are_bounded_check_stays_open(start_node):
    node = start_node()
    with grpc.insecure_channel(node.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        watches = [health.Watch(health_pb2.HealthCheckRequest()) for _ in range(MAX_HEALTH_WATCHES)]
        assert {next(watch).status for watch in watches} == {health_pb2.HealthCheckResponse.SERVING}
        with pytest.raises(grpc.RpcError) as refusal:
            next(health.Watch(health_pb2.HealthCheckRequest()))
        assert refusal.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "use Check" in refusal.value.details()
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == \
            health_pb2.HealthCheckResponse.SERVING
        watches[0].cancel()
        next_one = health.Watch(health_pb2.HealthCheckRequest())
        poll_until(lambda: next(next_one).status == health_pb2.HealthCheckResponse.SERVING, 30,
                   what="a Watch once one closed")
        for watch in (*watches, next_one):
            watch.cancel()


@pytest.mark.keys_unchecked     # binds a raw 64-byte key, which no password's metadata names
def test_a_master_key_over_the_limit_is_a_bad_request_and_claims_nothing(start_node):
    node = start_node()
    long_key, longest_key = b"k" * (MAX_KEY_BYTES + 1), b"k" * MAX_KEY_BYTES
    assert MAX_KEY_BYTES == 64     # clients send 32 bytes (protos/digest.py master_key)
    with NodeClient(node.address) as client:
        answers = [client.read_lac(5, fence=True, key=long_key), client.read(6, 0, fence=True, key=long_key),
                   client.write_lac(7, 0, key=long_key), *client.add(make_entry(8, 0, b"x", key=long_key))]
        assert [a.status for a in answers] == [pb.BAD_REQUEST] * 4, answers
        assert all(f"1..{MAX_KEY_BYTES} bytes" in a.message for a in answers), [a.message for a in answers]
        assert [client.read_lac(ledger_id).status for ledger_id in (5, 6, 7, 8)] == [pb.NO_LEDGER] * 4
        assert client.read_lac(5, fence=True, key=longest_key).status == pb.OK
        assert client.node_info().ledger_count == 1
