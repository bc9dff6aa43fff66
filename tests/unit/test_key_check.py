"""The first-sight key check (storage_node/key_check.py) against a stand-in metadata store whose reads the test
answers: the verdicts, one read shared by the requests that wait for the same ledger, a second read after a sync
before "no metadata" is believed, and ERROR, never a bound key, when ZooKeeper does not answer."""
from __future__ import annotations

import asyncio
import concurrent.futures

import pytest
from kazoo.exceptions import ConnectionLoss
from prometheus_client import CollectorRegistry, Counter

from metadata.errors import MetadataError, MetadataFormatError
from metadata.model import Fragment, LedgerMetadata, Versioned
from protos import ledger_pb2 as pb
from protos.digest import master_key, password_hash
from storage_node import key_check
from storage_node.key_check import KeyCheck, first_sight_verdict

KEY, OTHER = master_key(b"pw"), master_key(b"other")


def metadata(ledger_id: int, password: bytes = b"pw") -> Versioned[LedgerMetadata]:
    meta = LedgerMetadata(ledger_id, 1, 1, 1, (Fragment(0, ("node-1",)),), password_hash=password_hash(password))
    return Versioned(meta, 0)


class HeldReads:
    """read_ledger_async's stand-in: every read waits in `reads` until the test answers it."""

    def __init__(self):
        self.reads: list[tuple[int, bool, concurrent.futures.Future]] = []

    def read_ledger_async(self, ledger_id: int, *, synced: bool = False) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        self.reads.append((ledger_id, synced, future))
        return future


def lost_reply() -> MetadataError:
    """What the store's read fails with when its connection dropped or its session expired (store.no_reply)."""
    error = MetadataError("ZooKeeper request failed: ConnectionLoss")
    error.__cause__ = ConnectionLoss()
    return error


def counted() -> tuple[Counter, CollectorRegistry]:
    registry = CollectorRegistry()
    return Counter("lookups", "first-sight metadata reads", ["outcome"], registry=registry), registry


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_the_verdicts_of_a_key_against_the_metadata():
    assert first_sight_verdict(7, KEY, metadata(7).value) is None
    status, message = first_sight_verdict(7, OTHER, metadata(7).value)
    assert status == pb.UNAUTHORIZED and "does not match the password hash" in message
    status, message = first_sight_verdict(7, KEY, None)
    assert status == pb.UNAUTHORIZED and "ledger 7 has no metadata" in message
    unhashed = metadata(7).value.replace(password_hash="")      # metadata without a hash admits no key
    assert first_sight_verdict(7, KEY, unhashed)[0] == pb.UNAUTHORIZED


def test_requests_waiting_for_one_ledger_share_one_read_and_each_gets_its_own_verdict():
    async def scenario():
        store = HeldReads()
        lookups, registry = counted()
        check = KeyCheck(store, "node-1", lookups)
        waiting = [asyncio.ensure_future(check.verdict(7, key)) for key in (KEY, OTHER) * 10]
        other = asyncio.ensure_future(check.verdict(8, KEY))
        await settle()
        assert [(ledger_id, synced) for ledger_id, synced, _ in store.reads] == [(7, False), (8, False)]
        store.reads[0][2].set_result(metadata(7))
        store.reads[1][2].set_result(metadata(8, b"another"))
        verdicts = await asyncio.gather(*waiting)
        assert verdicts[0::2] == [None] * 10 and {v.status for v in verdicts[1::2]} == {pb.UNAUTHORIZED}
        assert (await other).status == pb.UNAUTHORIZED
        assert registry.get_sample_value("lookups_total", {"outcome": "found"}) == 2
        # Nothing is kept once answered: a later first sight (the key was not bound, say) reads again.
        again = asyncio.ensure_future(check.verdict(7, KEY))
        await settle()
        assert len(store.reads) == 3
        store.reads[2][2].set_result(metadata(7))
        assert await again is None

    asyncio.run(scenario())


def test_no_metadata_is_believed_only_after_a_synced_second_read():
    async def scenario():
        store = HeldReads()
        check = KeyCheck(store, "node-1")
        created = asyncio.ensure_future(check.verdict(7, KEY))      # created, but not yet on the node's follower
        await settle()
        store.reads[0][2].set_result(None)
        await settle()
        assert [(ledger_id, synced) for ledger_id, synced, _ in store.reads] == [(7, False), (7, True)]
        store.reads[1][2].set_result(metadata(7))
        assert await created is None
        never = asyncio.ensure_future(check.verdict(9, KEY))
        await settle()
        store.reads[2][2].set_result(None)
        await settle()
        store.reads[3][2].set_result(None)
        status, message = await never
        assert status == pb.UNAUTHORIZED and "ledger 9 has no metadata" in message

    asyncio.run(scenario())


def test_no_metadata_answers_only_the_requests_that_arrived_before_its_read_began():
    """An intruder's request for an id not created yet starts a read; the id is created and its creator's first
    add arrives while that read is out: the read's "no metadata" refuses the intruder, and the creator's request
    reads again, to find the metadata."""
    async def scenario():
        store = HeldReads()
        check = KeyCheck(store, "node-1")
        intruder = asyncio.ensure_future(check.verdict(7, OTHER))
        await settle()
        creator = asyncio.ensure_future(check.verdict(7, KEY))      # the ledger was created meanwhile
        await settle()
        store.reads[0][2].set_result(None)
        await settle()
        store.reads[1][2].set_result(None)      # the synced read was sent before the creation too
        await settle()
        status, message = await intruder
        assert status == pb.UNAUTHORIZED and "has no metadata" in message
        assert not creator.done() and [(ledger_id, synced) for ledger_id, synced, _ in store.reads[2:]] == [(7, False)]
        store.reads[2][2].set_result(metadata(7))
        assert await creator is None

    asyncio.run(scenario())


def test_a_read_that_got_no_reply_is_sent_again_within_the_bound(monkeypatch):
    """A node reconnecting to ZooKeeper (or renewing its expired session) a moment after it came back."""
    monkeypatch.setattr(key_check, "RETRY_PAUSE", 0.001)

    async def scenario():
        store = HeldReads()
        check = KeyCheck(store, "node-1")
        waiting = asyncio.ensure_future(check.verdict(7, KEY))
        await settle()
        store.reads[0][2].set_exception(lost_reply())
        await asyncio.wait_for(until_read(store, 2), 5)
        assert [(ledger_id, synced) for ledger_id, synced, _ in store.reads] == [(7, False), (7, False)]
        store.reads[1][2].set_result(metadata(7))
        assert await waiting is None

    asyncio.run(scenario())


async def until_read(store: HeldReads, count: int) -> None:
    while len(store.reads) < count:
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("failure", ["no reply", "undecodable", "no answer"])
def test_zookeeper_not_answering_is_an_error_never_a_verdict(monkeypatch, failure):
    monkeypatch.setattr(key_check, "LOOKUP_SECONDS", 0.2)
    monkeypatch.setattr(key_check, "RETRY_PAUSE", 0.01)

    async def scenario():
        store = HeldReads()
        lookups, registry = counted()
        check = KeyCheck(store, "node-1", lookups)
        waiting = asyncio.ensure_future(check.verdict(7, KEY))

        async def fail_reads() -> None:      # ZooKeeper away: each read sent fails (or is never answered)
            while not waiting.done():
                await asyncio.sleep(0.005)
                for _, _, read in store.reads:
                    if not read.done() and failure != "no answer":
                        read.set_exception(lost_reply() if failure == "no reply" else MetadataFormatError("damaged"))

        await asyncio.wait_for(fail_reads(), 5)
        status, message = await waiting
        assert status == pb.ERROR and "binds no key unchecked" in message, message
        assert ("no answer within" in message) == (failure != "undecodable")
        assert (len(store.reads) > 1) == (failure == "no reply")
        assert not check._lookups       # the next request asks again
        assert registry.get_sample_value("lookups_total", {"outcome": "failed"}) == 1

    asyncio.run(scenario())


def test_a_caller_that_goes_away_leaves_the_read_to_the_others():
    async def scenario():
        store = HeldReads()
        check = KeyCheck(store, "node-1")
        leaving, staying = (asyncio.ensure_future(check.verdict(7, KEY)) for _ in range(2))
        await settle()
        leaving.cancel()
        await settle()
        store.reads[0][2].set_result(metadata(7))
        assert await staying is None and len(store.reads) == 1

    asyncio.run(scenario())
