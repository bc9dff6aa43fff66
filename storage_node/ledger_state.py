"""Per-ledger state on a node: master key, fence flag, highest LAC seen and highest stored entry.

Pure decisions (no I/O) so they can be tested alone; storage.py journals what they allow. A refusal's
wording is shared with the client (protos/refusals.py).
"""
from __future__ import annotations

import dataclasses
import hmac
import time
from typing import NamedTuple

from protos import ledger_pb2 as pb
from protos.refusals import refusal
from storage_node.entry_index import LedgerIndex


class Refusal(NamedTuple):
    """A request refused: the Status answered and the message sent with it."""

    status: int
    message: str


Verdict = Refusal | None     # None when allowed


@dataclasses.dataclass(slots=True)
class LedgerState:
    ledger_id: int
    master_key: bytes
    fenced: bool = False
    last_add_confirmed: int = -1     # highest LAC seen, piggybacked or explicit (durable ones only)
    last_entry_id: int = -1          # highest entry stored (durable ones only)
    index: LedgerIndex = dataclasses.field(default_factory=LedgerIndex)
    key_durable: bool = False        # a KEY record is fsynced
    fence_durable: bool = False      # a FENCE record is fsynced
    key_group: object = None         # the journal group carrying this ledger's KEY record, while in flight
    fence_group: object = None       # the journal group carrying its FENCE record, while in flight
    # time.monotonic() when this node first saw the ledger: its first add, fence or LAC here, or the replay
    # after a restart (the true time is not kept: later is the safe direction). Garbage collection spares a
    # ledger younger than --gc-grace (rule 8), so a lagging ZooKeeper read cannot drop one just acknowledged.
    first_seen: float = dataclasses.field(default_factory=time.monotonic)

    def key_matches(self, master_key: bytes) -> bool:
        return hmac.compare_digest(self.master_key, master_key)

    def check_add(self, master_key: bytes, recovery: bool) -> Verdict:
        """Rules 6 and 7, checked when the add arrives."""
        if not self.key_matches(master_key):
            return Refusal(*refusal(pb.UNAUTHORIZED, self.ledger_id))
        if self.fenced and not recovery:
            return Refusal(*refusal(pb.FENCED, self.ledger_id))
        return None

    def check_fence(self, master_key: bytes) -> Verdict:
        """Rule 7: a fence with another key is refused and fences nothing."""
        if not self.key_matches(master_key):
            return Refusal(*refusal(pb.UNAUTHORIZED, self.ledger_id))
        return None

    def check_write_lac(self, master_key: bytes) -> Verdict:
        # An explicit LAC is a normal write: a fenced writer may not move the ledger on (rule 6).
        return self.check_add(master_key, recovery=False)

    def record_entry(self, entry_id: int, lac: int) -> bool:
        """A durable entry; True when the LAC advanced (long polls wake up)."""
        if entry_id > self.last_entry_id:
            self.last_entry_id = entry_id
        return self.record_lac(lac)

    def record_lac(self, lac: int) -> bool:
        if lac > self.last_add_confirmed:
            self.last_add_confirmed = lac
            return True
        return False
