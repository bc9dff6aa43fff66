"""The client transport's address lookup for a node it has not listed yet (connector/client/transport.py _lookup),
against a scripted metadata store whose session looks connected while ZooKeeper does not answer."""
import asyncio

import pytest

from connector.client.errors import NodeError
from connector.client.transport import ADDRESS_LIST_SECONDS, GrpcTransport
from metadata.errors import MetadataError, ZooKeeperUnreachableError
from protos import ledger_pb2 as pb


class SilentZooKeeper:
    """Connected, as a session looks for a while after ZooKeeper is cut off; every read goes unanswered."""
    connected = True

    def __init__(self):
        self.waits = []

    def children(self, path):               # a patient read: it waits for $LEDGER_ZK_WAIT_SECONDS, then gives up
        self.waits.append(None)
        raise ZooKeeperUnreachableError("ZooKeeper was unreachable for 60s (scripted)")

    def children_within(self, path, seconds):
        self.waits.append(seconds)
        raise MetadataError("no answer in time (scripted)")


def test_a_node_not_listed_yet_fails_as_the_node_failing_after_a_bounded_wait():
    """Writer/recovery audit 2026-11-29: the listing used the store's patient reads, on the client's loop, for up
    to $LEDGER_ZK_WAIT_SECONDS, and then raised a metadata error, which no caller takes for a node failing: a
    recovery's read window died with it and the recovery waited forever; a writer's resend failed the writer."""
    store = SilentZooKeeper()
    transport = GrpcTransport(store)

    async def read_range():
        request = pb.ReadRangeRequest(ledger_id=1, first_entry_id=0, last_entry_id=0)
        async for _ in transport.read_range("node-1", request, 1.0):
            pass

    with pytest.raises(NodeError, match="could not be read from ZooKeeper in time"):
        asyncio.run(read_range())
    assert store.waits == [ADDRESS_LIST_SECONDS]
    with pytest.raises(NodeError):
        asyncio.run(transport.read_lac("node-1", pb.ReadLacRequest(ledger_id=1), 1.0))
