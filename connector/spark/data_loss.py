"""failOnDataLoss: what a read does when offsets it asks for are no longer in the stream.

Offsets leave a stream from its front (a truncation, retention, an overwrite: connector/retention.py) and
never come back (rule 17). A read finds out in one of three ways: it asks for offsets below the stream's
first one (a startingOffsets, or a streaming query's next offset); its plan races the cut, and a page or a
ledger it lists is gone meanwhile (streams.OffsetsGoneError, NoSuchLedgerError); or an executor opens a
ledger the driver planned, deleted since (the cut deletes its ledgers without a grace, and so does deleting the
stream: every offset it held is then gone). Each is data loss
for the offsets the read asked for: with failOnDataLoss=true (the default, as in Spark's Kafka source) the
read fails with an error naming the first offset the stream still holds; with false it skips the lost
offsets with a warning and reads on from there. A plan that asked for no offset (a read from the earliest)
is made again from the new head: the stream's earliest offset is where it starts when the plan is made.
"""
from __future__ import annotations

import logging
from typing import Callable, TypeVar

from connector.client import NoSuchLedgerError
from connector.spark.errors import DataLossError
from metadata.errors import NoSuchStreamError, OffsetsGoneError
from metadata.model import StreamRecord
from metadata.store import MetadataStore
from metadata.streams import read_stream

log = logging.getLogger(__name__)

T = TypeVar("T")
PLAN_ATTEMPTS = 5   # plans of one read that a cut may overtake before it gives up (each re-reads the head)
GONE = (OffsetsGoneError, NoSuchLedgerError)


def data_lost(message: str, fail: bool) -> None:
    """Fail the read (fail=True), or warn that the lost offsets are skipped."""
    if fail:
        raise DataLossError(message + "; set failOnDataLoss=false to skip them")
    log.warning("%s; skipping them (failOnDataLoss=false)", message)


def checked_start(stream: str, offset: int, first: int, fail: bool) -> int:
    """offset, if the stream (starting at first) still holds it; else data loss, and first if skipped."""
    if offset >= first:
        return offset
    data_lost(
        f"stream {stream!r}: offsets {offset}..{first - 1} are gone (truncated, expired by retention or "
        f"overwritten: their ledgers were deleted); the first offset the stream still holds is {first}", fail,
    )
    return first


def planned(store: MetadataStore, stream: str, start: int | None, fail: bool,
            plan: Callable[[StreamRecord, int | None], T]) -> T:
    """plan(head, start) for the stream's current head, start checked against its first offset. A plan that a
    cut overtakes (a page or a ledger it lists is gone meanwhile) is made again from the new head; that is data
    loss if the stream now starts above start. start None asks for no offset (a read from the earliest, a
    streaming source sizing the stream): what the stream holds when the plan is made is what it reads."""
    for _ in range(PLAN_ATTEMPTS):
        record = read_stream(store, stream).value
        lo = start if start is None else checked_start(stream, start, record.first_offset, fail)
        try:
            return plan(record, lo)
        except GONE as exc:
            now = read_stream(store, stream).value.first_offset
            if lo is not None and now > lo:
                data_lost(
                    f"stream {stream!r}: offsets {lo}..{now - 1} left the stream while this read was planned "
                    f"({exc}); the first offset the stream still holds is {now}", fail,
                )
                start = now
    raise DataLossError(
        f"stream {stream!r}: offsets kept leaving the stream while this read was planned ({PLAN_ATTEMPTS} plans "
        "overtaken by truncations or overwrites); run the read again"
    )


def read_or_lost(store: MetadataStore, stream: str | None, first_offset: int | None, fail: bool,
                 missing: NoSuchLedgerError) -> None:
    """An executor found the ledger a partition planned on gone. Data loss if the stream no longer holds the
    ledger's offsets (it now starts above the ledger's first offset); otherwise the error stands."""
    if stream is None or first_offset is None:
        raise missing
    try:
        now = read_stream(store, stream).value.first_offset
    except NoSuchStreamError as exc:   # the whole stream deleted since the plan: its every offset is gone
        data_lost(f"stream {stream!r}: the ledger holding offsets from {first_offset} was deleted with the stream "
                  f"after this read was planned ({exc})", fail)
        return
    if now <= first_offset:
        raise missing
    data_lost(
        f"stream {stream!r}: the ledger holding offsets from {first_offset} was deleted after this read was "
        f"planned (truncated, expired by retention or overwritten: {missing}); the first offset the stream still "
        f"holds is {now}", fail,
    )
