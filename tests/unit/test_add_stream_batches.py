"""How an Add stream cuts what is queued for a node into messages (connector/client/transport.py _AddStream):
everything at once while it fits in MAX_BATCH_BYTES, else batches of at most that much (at least one frame); a
frame alone in its message goes as it is when it is that large, or LONE_FRAME_BYTES or more and the only one
queued; the queued byte count follows what is left. The call is a recording stand-in for gRPC's (the stream's
batching is what is tested, not the network)."""
from __future__ import annotations

import asyncio

from connector.client.transport import LONE_FRAME_BYTES, MAX_BATCH_BYTES, _AddStream
from protos import wire


class RecordingCall:
    """Takes each message the stream writes; each write lets the loop run, so frames queued meanwhile wait."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []

    async def write(self, message: bytes) -> None:
        self.messages.append(message)
        await asyncio.sleep(0)

    async def read(self):
        await asyncio.Event().wait()     # no answers: the stream's receiver waits


def _sent(*sends: list[bytes]) -> tuple[list[bytes], _AddStream]:
    async def run():
        call = RecordingCall()
        stream = _AddStream("node-1", call, lambda response: None, lambda reason: None)
        for entries in sends:
            stream.send(entries)
        for _ in range(200):
            await asyncio.sleep(0)
            if not stream.queue:
                break
        for task in stream._tasks:
            task.cancel()
        return call.messages, stream
    return asyncio.run(run())


def _frames(message: bytes) -> bytes:
    return message[:-len(wire.RANGE_RESULTS)] if message.endswith(wire.RANGE_RESULTS) else message


def test_what_fits_in_a_batch_goes_as_one_message_asking_for_ranges():
    frames = [bytes([i]) * 1000 for i in range(50)]
    messages, stream = _sent(frames[:20], frames[20:])
    assert b"".join(_frames(m) for m in messages) == b"".join(frames)
    assert all(m.endswith(wire.RANGE_RESULTS) for m in messages)
    assert stream.queued_bytes == 0 and stream.queue == []


def test_more_than_a_batch_is_cut_at_max_batch_bytes_and_the_count_follows():
    frame = b"x" * (MAX_BATCH_BYTES // 4 + 1)         # four of them are over a batch: three per message
    messages, stream = _sent([frame] * 7)
    assert [len(_frames(m)) // len(frame) for m in messages] == [3, 3, 1]
    assert stream.queued_bytes == 0


def test_a_frame_of_a_batch_or_more_travels_alone_as_it_is():
    big, small = b"b" * MAX_BATCH_BYTES, b"s" * 100
    messages, stream = _sent([small, small, big, small, small])
    assert messages[0] == small + small + wire.RANGE_RESULTS
    assert messages[1] is big                          # not copied, no range flag: it is answered in results
    assert messages[2] == small + small + wire.RANGE_RESULTS
    assert stream.queued_bytes == 0


def test_a_large_frame_queued_alone_travels_as_it_is():
    """A Spark write task's entries (about 250 KiB compressed) are mostly queued one at a time: each went out
    copied to add the range flag, which one entry does not need. A small one keeps the flag: its copy costs
    little, and a node answers the stream's messages in one form for longer."""
    large, small = b"f" * LONE_FRAME_BYTES, b"s" * (LONE_FRAME_BYTES - 1)
    messages, _ = _sent([large])
    assert len(messages) == 1 and messages[0] is large
    messages, _ = _sent([small])
    assert messages == [small + wire.RANGE_RESULTS]
