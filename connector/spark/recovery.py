"""Driver-side ledger care: recover dangling ledgers before a read, discard ledgers a write must not keep.

Discarding fences and recovers a ledger before deleting it, so that a writer that is only paused
(a speculative or zombie attempt) can never add to it afterwards (rules 6 and 10).
"""
from __future__ import annotations

from connector.client import LedgerClient, NoSuchLedgerError, UnauthorizedError
from metadata.model import LedgerMetadata
from protos.digest import password_hash

JOB_TAG = "spark.job"
STREAM_TAG = "stream"
PARTITION_TAG = "spark.partition"
ATTEMPT_TAG = "spark.attempt"
TASK_TAG = "spark.task"


def check_password(meta: LedgerMetadata, password: bytes, what: str) -> None:
    """Reject a wrong password from the metadata, before any node is asked and before anything is written."""
    if meta.password_hash and meta.password_hash != password_hash(password):
        raise UnauthorizedError(
            f"wrong password for {what}: ledger {meta.ledger_id} was written with another password; "
            "give the right one with option(\"password\", ...)"
        )


def recover(lc: LedgerClient, ledger_id: int, password: bytes) -> int:
    """Fence and close the ledger (retrying while recovery cannot decide); returns its last entry id."""
    return lc.recover_ledger_with_retry(ledger_id, password).last_entry_id


def discard(lc: LedgerClient, ledger_id: int, password: bytes) -> None:
    """Fence, recover and delete the ledger; done as well when it is gone before or meanwhile (a failing task
    deletes its own ledger, perhaps while this recovers it)."""
    try:
        if not lc.ledger_metadata(ledger_id).is_closed:
            recover(lc, ledger_id, password)
        lc.delete_ledger(ledger_id)
    except NoSuchLedgerError:
        pass
