"""The single owner of a stream (seed 002 figures 1-2, seed 001): a chain of ledgers, one writer at a time.

Taking ownership recovers and closes the stream's last OPEN ledger, which fences the previous owner even
if it is only paused, and then adds a new ledger to the stream by compare-and-set at the next offset
(DESIGN rule 14). Leases and liveness are never trusted: a second writer that takes over fences the
first, whose next append raises LedgerFencedError, so two owners never interleave.

Raw streams count one offset per entry: the entry `e` of a ledger registered at offset `k` is offset `k + e`.

Every entry carries its append time (entry_time.py): the writer's clock in milliseconds, never decreasing
over all of its ledgers, and starting no lower than the last time of the ledger it took over from (its
predecessor's clock may be ahead), so that the times of a stream written by stream writers never decrease
and a time search finds exactly the first offset at or after a time (time_search.py). Each ledger is closed
with its first and last time in its metadata.
"""
from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
import uuid
from typing import Iterable

from connector.client import entry_time, time_search
from connector.client.api import LedgerClient, WriteHandle
from connector.client.errors import (LedgerClosedError, LedgerError, LedgerFencedError, NoSuchLedgerError,
                                     check_entry_sizes)
from metadata import layout, streams
from metadata.model import LedgerState, StreamLedger, StreamRecord

log = logging.getLogger(__name__)

RAW_FORMAT = "raw"


class StreamWriter:
    """Appends payloads to a stream as its only owner, rolling to a new ledger by size, count or age."""

    def __init__(
        self,
        client: LedgerClient,
        name: str,
        *,
        ensemble_size: int = 3,
        write_quorum: int = 3,
        ack_quorum: int = 2,
        password: bytes = b"",
        max_ledger_entries: int | None = None,
        max_ledger_bytes: int | None = 256 * 1024 * 1024,
        max_ledger_age: float | None = None,
        clock: entry_time.AppendClock | None = None,
    ):
        """clock: where append times come from (default: this host's clock, never decreasing)."""
        self._client = client
        self._store = client.store
        self.name = streams.check_stream_name(name)
        self._ledger_args = dict(
            ensemble_size=ensemble_size, write_quorum=write_quorum, ack_quorum=ack_quorum, password=password,
        )
        self._password = password
        self._max_entries = max_ledger_entries
        self._max_bytes = max_ledger_bytes
        self._max_age = max_ledger_age
        self.owner_id = f"stream-writer-{uuid.uuid4().hex[:12]}"
        self._ledger: WriteHandle | None = None
        self._clock = clock or entry_time.AppendClock()
        self._times = entry_time.Stamper(self._clock)
        self._first_offset = 0
        self._ledger_bytes = 0
        self._ledger_entries = 0
        self._ledger_started = 0.0
        self._closed = False
        self._roll_due = False     # a roll failed: the next append makes it again
        self._rolling_to: WriteHandle | None = None   # and to this ledger, which the stream may hold already
        self._take_ownership()

    # -- ownership -----------------------------------------------------------------------------

    def _take_ownership(self) -> None:
        """Recover the last OPEN ledger (fencing its writer), then CAS our new ledger onto the stream. A CAS whose
        reply was lost is read back (rule 16): found in the stream, it is not made again."""
        created: list[WriteHandle] = []
        previous: list[StreamLedger] = []

        def transform(record: StreamRecord) -> StreamRecord | None:
            if record.format != RAW_FORMAT:
                raise streams.InvalidStreamFormatError(
                    f"stream {self.name!r} holds {record.format} entries written by Spark; "
                    "a stream writer appends raw payloads: use another stream name"
                )
            if created and self._landed(record, created[0].ledger_id):
                return None   # this takeover landed, its reply was lost
            sealed = self._seal_open_tail(record)
            # The last ledger with entries: an empty one (an owner that died before appending) has no last time,
            # and the floor must not fall back to its metadata's time below its predecessors' (a clock ahead).
            previous[:] = [ledger for ledger in reversed(sealed.tail)
                           if ledger.last_offset is not None and not ledger.empty][:1]
            if not created:  # one new ledger, kept when the CAS is retried (the stream changed meanwhile)
                created.append(self._new_ledger())
            ledger_id = created[0].ledger_id
            return sealed.replace(tail=sealed.tail + (StreamLedger(ledger_id, sealed.next_offset, None),),
                                  owner=self.owner_id)

        try:
            empty = StreamRecord(self.name, RAW_FORMAT)
            record = streams.update_stream(self._store, self.name, transform, create=empty, read_back=True).value
        except BaseException:
            if created and self._discard_unless_held(created[0]):
                created[0].abandon()   # no writer of it is left: the stream's next owner recovers it
            raise
        if previous:
            self._start_after(previous[0])
        self._start_ledger(created[0], record.last_ledger.first_offset)

    def _start_after(self, previous: StreamLedger) -> None:
        """Never stamp below the previous owner's last time (its clock may be ahead of ours). Best effort: the
        stream is ours already, and a failed read only costs the order of times across this handover."""
        try:
            self._clock.advance_to(time_search.last_time(self._client, previous.ledger_id, self._password))
        except LedgerError as exc:
            log.warning("stream %r: the last time of ledger %d was not read (%s); this writer's times start from "
                        "its own clock", self.name, previous.ledger_id, exc)

    def _seal_open_tail(self, record: StreamRecord) -> StreamRecord:
        tail = record.last_ledger
        if tail is None or tail.last_offset is not None:
            return record
        # Recovery fences the previous owner's ledger on its nodes and closes it at the last entry
        # that may have been acknowledged (rules 10-13); a paused owner can add nothing after this.
        recovered = self._client.recover_ledger_with_retry(tail.ledger_id, password=self._password)
        last_offset = tail.first_offset + recovered.last_entry_id
        return record.replace(tail=record.tail[:-1] + (StreamLedger(tail.ledger_id, tail.first_offset, last_offset),))

    def _new_ledger(self) -> WriteHandle:
        return self._client.create_ledger(
            **self._ledger_args,
            custom_metadata=entry_time.marked({"stream": self.name, "stream_owner": self.owner_id}),
        )

    def _landed(self, record: StreamRecord, ledger_id: int) -> bool:
        """Whether an update of this writer that puts ledger_id last on the stream landed (its reply lost): True
        if the stream is still this writer's with that ledger last. LedgerFencedError if the stream holds the
        ledger but another writer took it over since: the ledger is the stream's, and this writer is fenced."""
        last = record.last_ledger
        if record.owner == self.owner_id and last is not None and last.ledger_id == ledger_id:
            return True
        if ledger_id in streams.held_ledgers(self._store, record, [ledger_id]):
            raise self._fenced(record)
        # Not held: never landed, or landed and then taken over (its ledger recovered) and taken off the stream
        # since (a truncation, a delete of the stream). Only this writer writes its ledger: anyone else having
        # recovered or deleted it means the takeover landed, and putting it back would name a ledger that is
        # gone or closed, after fencing the owner that took over.
        try:
            meta = self._client.ledger_metadata(ledger_id)
        except NoSuchLedgerError:
            raise self._fenced(record) from None
        if meta.state is not LedgerState.OPEN:
            raise self._fenced(record)
        return False

    def _fenced(self, record: StreamRecord) -> LedgerFencedError:
        return LedgerFencedError(
            f"stream {self.name!r} was taken over by {record.owner or 'another writer'}: this writer "
            "is fenced; an append not acknowledged to it may be in the stream or not (the takeover's recovery "
            "decides: read the stream's end to know) before you append it again; open a new stream writer to continue"
        )

    def _discard_unless_held(self, ledger: WriteHandle) -> bool:
        """Delete a ledger this writer made for the stream, after an update that was to put it there failed, unless
        the stream holds it: a lost reply may have landed it, and another writer may have taken the stream over
        since (the ledger is then the stream's, recovered and sealed by that writer). When the stream cannot be
        read, the ledger is kept: left OPEN, it costs its space; deleted while the stream names it, every read of
        the stream and every later takeover would fail. Whether it was kept."""
        try:
            self._store.sync(layout.stream_path(self.name))
            record = streams.read_stream(self._store, self.name).value
            if ledger.ledger_id in streams.held_ledgers(self._store, record, [ledger.ledger_id]):
                return True
        except streams.NoSuchStreamError:
            pass   # deleted meanwhile: nothing can name the ledger
        except LedgerError as exc:
            log.warning("stream %r: ledger %d was kept: whether the stream holds it could not be read (%s)",
                        self.name, ledger.ledger_id, exc)
            return True
        try:
            ledger.close()
            self._client.delete_ledger(ledger.ledger_id)
        except LedgerError as exc:   # the update's own error is the one to raise
            log.warning("stream %r: ledger %d, made for an update that failed, was not deleted: %s",
                        self.name, ledger.ledger_id, exc)
        return False

    def _start_ledger(self, ledger: WriteHandle, first_offset: int) -> None:
        self._ledger = ledger
        self._roll_due = False
        self._times = entry_time.Stamper(self._clock)
        self._first_offset = first_offset
        self._ledger_bytes = 0
        self._ledger_entries = 0
        self._ledger_started = time.monotonic()

    # -- appending -----------------------------------------------------------------------------

    @property
    def ledger_id(self) -> int:
        return self._ledger.ledger_id

    def append(self, payload: bytes) -> int:
        """Append one entry, stamped with its append time; returns its stream offset once ack_quorum nodes
        acknowledged it."""
        return self.append_async(payload).result()

    def append_async(self, payload: bytes) -> "concurrent.futures.Future[int]":
        if self._closed:
            raise LedgerClosedError(f"the writer of stream {self.name!r} is closed; open a new stream writer")
        self._check_sizes((payload,))
        if self._should_roll():
            self.roll()
        first_offset = self._first_offset
        entry = self._ledger.append_async(self._times.stamp(payload))
        self._ledger_bytes += len(payload)
        self._ledger_entries += 1
        offset: concurrent.futures.Future[int] = concurrent.futures.Future()

        def done(f: concurrent.futures.Future) -> None:
            if f.exception() is not None:
                offset.set_exception(f.exception())
            else:
                offset.set_result(first_offset + f.result())

        entry.add_done_callback(done)
        return offset

    def append_many(self, payloads: Iterable[bytes]) -> list[int]:
        """Append several entries in order, each stamped with its append time; returns their stream offsets once
        every one was acknowledged. Entries may land in more than one ledger (a roll between them), each
        ledger's share going as one batch (WriteHandle.append_many)."""
        return self.append_many_async(payloads).result()

    def append_many_async(self, payloads: Iterable[bytes]) -> "concurrent.futures.Future[list[int]]":
        """append_many without waiting: a future of the stream offsets."""
        if self._closed:
            raise LedgerClosedError(f"the writer of stream {self.name!r} is closed; open a new stream writer")
        payloads = payloads if isinstance(payloads, (list, tuple)) else list(payloads)
        self._check_sizes(payloads)   # before a roll or a batch is sent: an oversized entry appends nothing
        parts: list[tuple[int, concurrent.futures.Future]] = []   # (first offset of the ledger, its batch)
        batch: list[bytes] = []
        for payload in payloads:
            if self._should_roll():
                if batch:
                    parts.append((self._first_offset, self._ledger.append_many_async(batch)))
                    batch = []
                self.roll()   # waits for the batches sent to the ledger it closes
            batch.append(self._times.stamp(payload))
            self._ledger_bytes += len(payload)
            self._ledger_entries += 1
        if batch:
            parts.append((self._first_offset, self._ledger.append_many_async(batch)))
        return _joined_offsets(parts)

    def _check_sizes(self, payloads) -> None:
        """EntryTooLargeError unless every entry, with the time frame it gets, fits the client's max_entry_bytes."""
        check_entry_sizes(payloads, self._client.max_entry_bytes, overhead=entry_time.FRAME.size)

    def _should_roll(self) -> bool:
        if self._roll_due:
            return True
        if self._ledger_entries == 0:
            return False
        return (
            (self._max_entries is not None and self._ledger_entries >= self._max_entries)
            or (self._max_bytes is not None and self._ledger_bytes >= self._max_bytes)
            or (self._max_age is not None and time.monotonic() - self._ledger_started >= self._max_age)
        )

    def roll(self) -> None:
        """Close the current ledger and continue on a new one, in one stream CAS. A roll that fails (its ledger
        may be closed already) is made again by the next append, whatever the roll limits say, with the same new
        ledger if the stream may hold it: an update whose outcome was unknown is then found landed."""
        self._roll_due = True
        closed = self._close_ledger()
        ledger, self._rolling_to = self._rolling_to or self._new_ledger(), None
        try:
            record = self._update_own_stream(closed, ledger.ledger_id)
        except BaseException:
            if self._discard_unless_held(ledger):
                self._rolling_to = ledger
            raise
        self._start_ledger(ledger, record.last_ledger.first_offset)

    def close(self) -> None:
        """Close the current ledger and seal it on the stream; closing twice is safe."""
        if self._closed:
            return
        self._closed = True
        self._update_own_stream(self._close_ledger(), None)

    def _close_ledger(self) -> tuple[int, int]:
        ledger = self._ledger
        ledger.close(custom_metadata=self._times.close_metadata())
        return ledger.ledger_id, ledger.last_add_confirmed

    def _update_own_stream(self, closed: tuple[int, int], new_ledger_id: int | None) -> StreamRecord:
        """Seal the closed ledger on the stream (and append the new one) in one CAS. A write whose reply was lost
        is read back (rule 16): found in the stream, it is not written again; the new ledger is never left out
        of the stream by a lost reply (it would be orphaned: a stream's ledger the stream never got)."""
        closed_id, last_entry_id = closed

        def transform(record: StreamRecord) -> StreamRecord | None:
            tail = record.last_ledger
            if record.owner == self.owner_id and _holds(record, closed_id, new_ledger_id):
                return None   # this update landed, its reply was lost
            if record.owner != self.owner_id or tail is None or tail.ledger_id != closed_id:
                raise self._fenced(record)
            ledgers = record.tail[:-1] + (StreamLedger(closed_id, tail.first_offset, tail.first_offset + last_entry_id),)
            if new_ledger_id is not None:
                ledgers += (StreamLedger(new_ledger_id, tail.first_offset + last_entry_id + 1, None),)
            return record.replace(tail=ledgers)

        return streams.update_stream(self._store, self.name, transform, read_back=True).value

    def __enter__(self) -> "StreamWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _holds(record: StreamRecord, closed_id: int, new_ledger_id: int | None) -> bool:
    """Whether the stream already holds the update that seals closed_id (and appends new_ledger_id after it: a
    ledger just created, so its being the tail says the update landed; the sealed one may be paged by then)."""
    last = record.last_ledger
    if last is None:
        return False
    if new_ledger_id is not None:
        return last.ledger_id == new_ledger_id
    return last.ledger_id == closed_id and last.last_offset is not None


def _joined_offsets(parts: list[tuple[int, concurrent.futures.Future]]) -> "concurrent.futures.Future[list[int]]":
    """One future of the offsets of several ledgers' batches (first offset of the ledger, future of entry ids)."""
    joined: concurrent.futures.Future = concurrent.futures.Future()
    if not parts:
        joined.set_result([])
        return joined
    remaining = [len(parts)]
    lock = threading.Lock()   # callbacks run on the client's I/O thread, or here for a part already done

    def done(_: concurrent.futures.Future) -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0] > 0:
                return
        for _first, part in parts:
            if part.exception() is not None:
                joined.set_exception(part.exception())
                return
        joined.set_result([first + entry_id for first, part in parts for entry_id in part.result()])

    for _first, part in parts:
        part.add_done_callback(done)
    return joined
