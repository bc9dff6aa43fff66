"""Fencing and the master key on a real node (rules 6 and 7), across restarts. The ledgers have metadata naming
KEY's password, as a writer's do: the node binds a key only then (tests/security/test_ledger_claims.py)."""
from __future__ import annotations

from protos import ledger_pb2 as pb
from tests.harness.node_client import KEY, OTHER_KEY, PASSWORD, NodeClient, given_ledgers, make_entry


def test_fence_is_durable_one_way_and_lets_recovery_adds_through(start_node, store):
    given_ledgers(store, {5: PASSWORD})
    node = start_node()
    with NodeClient(node.address) as client:
        assert [r.status for r in client.add(*[make_entry(5, e, b"e%d" % e) for e in range(4)])] == [pb.OK] * 4
        fenced = client.read_lac(5, fence=True, key=KEY)
        assert (fenced.status, fenced.last_entry_id, fenced.last_add_confirmed) == (pb.OK, 3, 2)
        assert client.add(make_entry(5, 4, b"late"))[0].status == pb.FENCED
        assert client.read_lac(5, fence=True, key=KEY).status == pb.OK          # idempotent
    node.restart()
    with NodeClient(node.address) as client:
        assert client.add(make_entry(5, 4, b"late"))[0].status == pb.FENCED
        assert client.write_lac(5, 3).status == pb.FENCED
        assert client.add(make_entry(5, 4, b"recovered", recovery=True))[0].status == pb.OK
        assert client.read(5, 4).payload == b"recovered"
        assert client.read(5, 0).payload == b"e0"


def test_wrong_master_key_is_unauthorized_and_a_rejected_fence_fences_nothing(start_node, store):
    given_ledgers(store, {6: PASSWORD})
    node = start_node()
    with NodeClient(node.address) as client:
        assert client.add(make_entry(6, 0, b"first"))[0].status == pb.OK
        assert client.add(make_entry(6, 1, b"intruder", key=OTHER_KEY))[0].status == pb.UNAUTHORIZED
        assert client.read_lac(6, fence=True, key=OTHER_KEY).status == pb.UNAUTHORIZED
        assert client.read(6, 0, fence=True, key=OTHER_KEY).status == pb.UNAUTHORIZED
        assert client.add(make_entry(6, 1, b"second"))[0].status == pb.OK
    node.restart()
    with NodeClient(node.address) as client:
        assert client.add(make_entry(6, 2, b"third"))[0].status == pb.OK
        assert client.read(6, 1).payload == b"second"


def test_fence_of_an_unknown_ledger_creates_it_fenced(start_node, store):
    given_ledgers(store, {9: PASSWORD})
    node = start_node()
    with NodeClient(node.address) as client:
        assert client.read_lac(9, fence=False).status == pb.NO_LEDGER
        fenced = client.read(9, 0, fence=True, key=KEY)
        assert fenced.status == pb.NO_ENTRY
        lac = client.read_lac(9)
        assert (lac.status, lac.last_entry_id, lac.last_add_confirmed) == (pb.OK, -1, -1)
        assert client.add(make_entry(9, 0, b"too late"))[0].status == pb.FENCED
    node.restart()
    with NodeClient(node.address) as client:
        assert client.add(make_entry(9, 0, b"too late"))[0].status == pb.FENCED
        assert client.add(make_entry(9, 0, b"x", key=OTHER_KEY, recovery=True))[0].status == pb.UNAUTHORIZED
        ranged = client.read_range(9, 0, 10, fence=True, master_key=KEY)
        assert ranged[-1].done and ranged[0].status == pb.OK and not any(m.entries for m in ranged)
