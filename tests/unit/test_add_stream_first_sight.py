"""An Add stream while the first-sight key check of a new ledger waits for ZooKeeper (storage_node/service.py Add,
storage_node/key_check.py): the entries of ledgers the node holds, in the same request and after it, are journaled
and answered meanwhile; the new ledger's are answered once the check answers, journaled in the order the stream
sent them; a refused key binds nothing. A real Storage and journal in a temporary directory; the check's verdicts
are the test's."""
from __future__ import annotations

import asyncio
import contextlib

from protos import ledger_pb2 as pb
from storage_node.config import NodeConfig
from storage_node.ledger_state import Refusal
from storage_node.service import StorageNodeService
from storage_node.storage import Storage
from tests.harness.node_client import KEY, OTHER_KEY, make_entry

HELD, NEW = 1, 2


class HeldVerdicts:
    """A key check whose verdicts the test gives, per ledger: it admits KEY, refuses any other."""

    def __init__(self):
        self.answers: dict[int, asyncio.Future] = {}
        self.asked: list[int] = []

    async def verdict(self, ledger_id: int, key: bytes):
        self.asked.append(ledger_id)
        await asyncio.shield(self.answers.setdefault(ledger_id, asyncio.get_running_loop().create_future()))
        return None if key == KEY else Refusal(pb.UNAUTHORIZED, f"wrong key for ledger {ledger_id}")

    def answer(self, ledger_id: int) -> None:
        self.answers.setdefault(ledger_id, asyncio.get_running_loop().create_future()).set_result(None)


class Stream:
    """The client's end of one Add stream: requests sent when the test says, answers as they are written."""

    def __init__(self):
        self.requests: asyncio.Queue = asyncio.Queue()
        self.answered: list[tuple[int, int, int]] = []     # (ledger, entry, status), in the order written

    def send(self, *entries: pb.AddEntry) -> None:
        self.requests.put_nowait(pb.AddRequest(entries=entries, range_results=True))

    def end(self) -> None:
        self.requests.put_nowait(None)

    async def iterate(self):
        while (request := await self.requests.get()) is not None:
            yield request

    async def write(self, response: pb.AddResponse) -> None:
        self.answered += [(r.ledger_id, e, r.status) for r in response.ranges
                          for e in range(r.first_entry_id, r.last_entry_id + 1)]


async def until(condition, what: str) -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never happened: {what}")


@contextlib.asynccontextmanager
async def add_stream(tmp_path):
    """A real Storage with the test's verdicts, and one Add stream served: (storage, check, stream, serving)."""
    storage = Storage(NodeConfig(data_dir=tmp_path, port=0, metadata="zk://127.0.0.1:1/unused", node_id="unit"))
    await storage.open()
    check = storage.key_check = HeldVerdicts()
    service = StorageNodeService(storage, storage.config)
    stream = Stream()
    serving = asyncio.ensure_future(service.Add(stream.iterate(), stream))
    try:
        yield storage, check, stream, serving
    finally:
        serving.cancel()
        await storage.close()


def test_held_ledgers_are_answered_while_a_new_ones_key_check_waits(tmp_path):
    async def scenario():
        async with add_stream(tmp_path) as (storage, check, stream, serving):
            check.answer(HELD)
            stream.send(make_entry(HELD, 0, b"held 0"))
            await until(lambda: (HELD, 0, pb.OK) in stream.answered, "the held ledger's first answer")

            stream.send(make_entry(NEW, 0, b"first copy"), make_entry(HELD, 1, b"held 1"))
            stream.send(make_entry(HELD, 2, b"held 2"), make_entry(NEW, 0, b"second copy", key=OTHER_KEY))
            stream.send(make_entry(NEW, 0, b"third copy"), make_entry(NEW, 1, b"new 1"))
            await until(lambda: (HELD, 2, pb.OK) in stream.answered, "the held ledger's later answers")
            assert [a for a in stream.answered if a[0] == NEW] == [] and NEW not in storage.ledgers
            assert check.asked.count(NEW) >= 1

            check.answer(NEW)
            stream.end()
            await asyncio.wait_for(serving, 10)
            assert [a for a in stream.answered if a[0] == NEW] == [
                (NEW, 0, pb.OK), (NEW, 0, pb.UNAUTHORIZED), (NEW, 0, pb.OK), (NEW, 1, pb.OK)]
            # Journaled in the order sent: the last copy the stream sent of entry 0 is the one stored.
            assert bytes(storage.read_entry(NEW, 0).payload) == b"third copy"
            assert storage.ledgers[NEW].key_matches(KEY)

    asyncio.run(scenario())


def test_a_refused_first_key_binds_nothing_and_the_right_one_is_bound_later(tmp_path):
    async def scenario():
        storage = Storage(NodeConfig(data_dir=tmp_path, port=0, metadata="zk://127.0.0.1:1/unused", node_id="unit"))
        await storage.open()
        check = storage.key_check = HeldVerdicts()
        check.answer(NEW)
        try:
            assert (await storage.fence(NEW, OTHER_KEY)).status == pb.UNAUTHORIZED
            assert (await storage.write_lac(NEW, OTHER_KEY, 0)).status == pb.UNAUTHORIZED
            intruder = [make_entry(NEW, 0, b"x", key=OTHER_KEY)]
            runs, group = storage.add_runs(intruder, await storage.first_sight_verdicts(intruder))
            assert [r.status for r in runs] == [pb.UNAUTHORIZED] and group is None
            # An add that skipped the check is refused too, as unknown: never bound unchecked.
            [unchecked], _ = storage.add_runs([make_entry(NEW, 0, b"x")])
            assert unchecked.status == pb.ERROR and "has not checked" in unchecked.message
            assert NEW not in storage.ledgers
            assert await storage.fence(NEW, KEY) is None
            assert storage.ledgers[NEW].fenced and storage.ledgers[NEW].key_matches(KEY)
        finally:
            await storage.close()

    asyncio.run(scenario())


def test_a_ledger_bound_while_a_part_of_it_is_set_aside_keeps_the_streams_order(tmp_path):
    """A part of ledger NEW waits behind another new ledger's check; another request binds NEW meanwhile (a
    WriteLac). The stream's next entries of NEW waited for nothing, and were journaled before the earlier part
    (review, 2026-11-29): a ledger with a part set aside stays set aside on that stream until the part is journaled."""
    slow, new = 7, 8

    async def scenario():
        async with add_stream(tmp_path) as (storage, check, stream, serving):
            check.answer(new)                       # NEW's metadata is found at once; SLOW's check waits
            stream.send(make_entry(slow, 0, b"slow 0"))
            stream.send(make_entry(new, 0, b"first copy"))     # set aside behind SLOW's part
            await until(lambda: check.asked.count(new) >= 1, "NEW asked")
            assert await storage.write_lac(new, KEY, -1) is None   # another request binds NEW meanwhile
            stream.send(make_entry(new, 0, b"second copy"))
            stream.send(make_entry(new, 1, b"next"))
            check.answer(slow)
            await until(lambda: (new, 1, pb.OK) in stream.answered, "the stream's last entry answered")
            assert bytes(storage.read_entry(new, 0).payload) == b"second copy"
            stream.end()
            await asyncio.wait_for(serving, 10)

    asyncio.run(scenario())
