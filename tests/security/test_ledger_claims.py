"""Rule 7 at a ledger's first sight (storage_node/key_check.py): a client holding the node token but not a ledger's
password cannot claim the ledger on a node, neither before it is created nor after. Real nodes, real ZooKeeper.

Before the check a node bound the key of whatever add, fence or WriteLac named a ledger first: a token holder could
fence the ids about to be created with a key of its own, and their creator's adds were refused."""
from __future__ import annotations

import grpc
import pytest

from connector.client import LedgerClient
from protos import ledger_pb2 as pb
from protos.auth import TOKEN_METADATA_KEY
from protos.digest import master_key
from protos.ledger_pb2_grpc import StorageNodeStub
from tests.harness.node_client import KEY, PASSWORD, given_ledgers, make_entry

TOKEN = "cluster-token"
AUTH = ((TOKEN_METADATA_KEY, TOKEN),)
CLAIMED = 8                                   # ids past the last one allocated that the intruder claims
INTRUDER_KEY = master_key(b"intruder")
CREATOR_PASSWORD = b"creator's"


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


def claims(stub: StorageNodeStub, ledger_id: int, key: bytes) -> dict[str, tuple[int, str]]:
    """(status, message) of each way to bind a key to a ledger on a node: a fence, a WriteLac, an add."""
    fence = stub.ReadLac(pb.ReadLacRequest(ledger_id=ledger_id, fence=True, master_key=key), timeout=10,
                         metadata=AUTH)
    lac = stub.WriteLac(pb.WriteLacRequest(ledger_id=ledger_id, master_key=key, last_add_confirmed=0), timeout=10,
                        metadata=AUTH)
    [added] = [r for m in stub.Add(iter([pb.AddRequest(entries=[make_entry(ledger_id, 0, b"mine", key=key)])]),
                                   timeout=10, metadata=AUTH) for r in m.results]
    return {"fence": (fence.status, fence.message), "write_lac": (lac.status, lac.message),
            "add": (added.status, added.message)}


def test_ids_not_created_yet_cannot_be_claimed_and_their_creator_writes_them(start_node, metadata_uri, store,
                                                                             token_file):
    nodes = [start_node(None, "--auth-token-file", str(token_file)) for _ in range(3)]
    last = store.allocate_ledger_id()      # what any client can do: the next ledgers get the ids after it
    for node in nodes:
        with grpc.insecure_channel(node.address) as channel:
            stub = StorageNodeStub(channel)
            for ledger_id in range(last + 1, last + 1 + CLAIMED):
                for what, (status, message) in claims(stub, ledger_id, INTRUDER_KEY).items():
                    assert status == pb.UNAUTHORIZED, (node.node_id, ledger_id, what, status, message)
                    assert f"ledger {ledger_id} has no metadata" in message, message
                # Nothing was bound or fenced: the node has no record of the ledger.
                lac = stub.ReadLac(pb.ReadLacRequest(ledger_id=ledger_id), timeout=10, metadata=AUTH)
                assert lac.status == pb.NO_LEDGER, (ledger_id, lac)

    with LedgerClient(metadata_uri, auth_token=TOKEN) as client:
        with client.create_ledger(3, 3, 2, password=CREATOR_PASSWORD) as writer:
            assert last < writer.ledger_id <= last + CLAIMED     # one of the ids the intruder went for
            for i in range(20):
                writer.append(b"entry %d" % i)
        reader = client.open_ledger(writer.ledger_id, password=CREATOR_PASSWORD)
        assert [e.payload for e in reader.read(0, 19)] == [b"entry %d" % i for i in range(20)]

    # Once created, the ledger's key is bound on its nodes: the intruder's key is refused by every way in, and
    # the refused fence fenced nothing (a recovery with the right password closes it where its writer left it).
    for node in nodes:
        with grpc.insecure_channel(node.address) as channel:
            for what, (status, message) in claims(StorageNodeStub(channel), writer.ledger_id, INTRUDER_KEY).items():
                assert status == pb.UNAUTHORIZED, (node.node_id, what, status, message)


def test_a_node_binds_at_first_sight_only_the_key_its_metadata_names(start_node, store):
    """A ledger with metadata that a node has not seen yet (a replacement node, a re-replication target): the
    first add with another key is refused naming the mismatch and binds nothing; the owner's then binds."""
    node = start_node()
    created = store.allocate_ledger_id()
    given_ledgers(store, {created: PASSWORD})
    with grpc.insecure_channel(node.address) as channel:
        stub = StorageNodeStub(channel)
        for what, (status, message) in claims(stub, created, INTRUDER_KEY).items():
            assert status == pb.UNAUTHORIZED, (what, status, message)
            assert "does not match the password hash in the ledger's metadata" in message, message
        assert stub.ReadLac(pb.ReadLacRequest(ledger_id=created), timeout=10, metadata=AUTH).status == pb.NO_LEDGER
        [owner] = [r for m in stub.Add(iter([pb.AddRequest(entries=[make_entry(created, 0, b"owner's")])]),
                                       timeout=10) for r in m.results]
        assert owner.status == pb.OK, owner
        assert stub.Read(pb.ReadRequest(ledger_id=created, entry_id=0), timeout=10).payload == b"owner's"


def test_a_fence_of_a_ledger_without_metadata_is_refused_and_fences_nothing(start_node, store):
    """Never created, or deleted before this node saw it: no key can be bound, and the fence fences nothing."""
    node = start_node()
    never, gone = store.allocate_ledger_id(), store.allocate_ledger_id()
    given_ledgers(store, {gone: PASSWORD})
    store.delete_ledger(gone)
    with grpc.insecure_channel(node.address) as channel:
        stub = StorageNodeStub(channel)
        for ledger_id in (never, gone):
            fence = stub.ReadLac(pb.ReadLacRequest(ledger_id=ledger_id, fence=True, master_key=KEY), timeout=10)
            assert fence.status == pb.UNAUTHORIZED and f"ledger {ledger_id} has no metadata" in fence.message, fence
            read = stub.Read(pb.ReadRequest(ledger_id=ledger_id, entry_id=0, fence=True, master_key=KEY), timeout=10)
            assert read.status == pb.UNAUTHORIZED, read
            assert stub.ReadLac(pb.ReadLacRequest(ledger_id=ledger_id), timeout=10).status == pb.NO_LEDGER
