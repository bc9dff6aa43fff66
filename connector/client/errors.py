"""The client's errors: one hierarchy under LedgerError and one table from node status to exception.

MetadataConflictError and NoSuchLedgerError come from the metadata package and are re-exported here so
that callers catch one family of names.
"""
from __future__ import annotations

from metadata.errors import LedgerError, MetadataConflictError, NoSuchLedgerError
from protos import ledger_pb2 as pb
from protos.refusals import REFUSALS

__all__ = [
    "LedgerError", "MetadataConflictError", "NoSuchLedgerError", "LedgerFencedError", "LedgerClosedError",
    "UnauthorizedError", "NotEnoughNodesError", "RecoveryIncompleteError", "RecoveryRestartError",
    "DigestMismatchError", "EntryTooLargeError", "EntryRefusedError", "NodeError", "NEGATIVES", "answered",
    "error_for_status", "refuses_ledger", "check_entry_sizes",
]


class LedgerFencedError(LedgerError):
    """Another client recovered the ledger (rules 6, 10): this writer may not add to it any more."""


class LedgerClosedError(LedgerError):
    """The ledger is closed: nothing more can be appended."""


class ClientClosedError(LedgerError):
    """The LedgerClient was closed before this call reached a storage node."""


class UnauthorizedError(LedgerError):
    """The password does not match the one the ledger was created with."""


class NotEnoughNodesError(LedgerError):
    """Fewer writable storage nodes are registered than the ensemble needs."""


class RecoveryIncompleteError(LedgerError):
    """Recovery could not decide an entry (rule 11) and closed nothing; retry when the nodes are back."""


class RecoveryRestartError(RecoveryIncompleteError):
    """The stored fragments changed while a recovery ran (rule 12): its close was refused; it starts again
    from the stored metadata."""


class DigestMismatchError(LedgerError):
    """An entry read back does not match its CRC32C digest: damaged in storage or in transit."""


class EntryTooLargeError(LedgerError):
    """An entry larger than the client's max_entry_bytes: refused before anything of the call was sent."""


class EntryRefusedError(LedgerError):
    """A node refused an entry as larger than its --max-entry-bytes (TOO_LARGE), a limit below the client's
    max_entry_bytes. Replacing the node would walk the writer through every node with that limit, so the writer
    stops at that entry instead: the entries acknowledged before it stay, those still waiting for acknowledgements
    fail with it (as for any error that stops a writer)."""


class NodeError(LedgerError):
    """A storage node answered with an error, or could not be reached: the outcome is unknown."""


def fenced_message(ledger_id: int) -> str:
    return REFUSALS[pb.FENCED].format(ledger=ledger_id)


def closed_message(ledger_id: int) -> str:
    return f"ledger {ledger_id} is closed; open it for reading or create a new ledger"


def unauthorized_message(ledger_id: int) -> str:
    return REFUSALS[pb.UNAUTHORIZED].format(ledger=ledger_id)


# A node's definite answer that it holds none of what was asked: the negatives rule 11 weighs. OK or a negative is
# the node's answer (answered); any other status, one this client does not know too, is the node's failure, and
# what it was asked stays unknown.
NEGATIVES = frozenset({pb.NO_LEDGER, pb.NO_ENTRY})


def answered(status: int) -> bool:
    """Whether a node's status is its answer (OK, or a negative: it has no such ledger or entry), for every op that
    asks nodes: a read, a LAC read, a recovery's range read. Otherwise it is the node's failure: the op counts
    the node as unknown, and a reader asks it last for a while."""
    return status == pb.OK or status in NEGATIVES


# The one status -> exception table. The NEGATIVES are answers the ops interpret themselves (rule 11);
# everything else that is not OK is an error, and all but these named ones are "unknown". The refusals'
# wording is the one the nodes send (protos/refusals.py).
_STATUS_ERRORS: dict[int, tuple[type[LedgerError], str]] = {
    pb.NO_LEDGER: (NoSuchLedgerError, "node {node} has no data of ledger {ledger}"),
    pb.NO_ENTRY: (NodeError, "node {node} has no entry {entry} of ledger {ledger}"),
    pb.FENCED: (LedgerFencedError, REFUSALS[pb.FENCED]),
    pb.UNAUTHORIZED: (UnauthorizedError, REFUSALS[pb.UNAUTHORIZED]),
    pb.READ_ONLY: (NodeError, "node {node} is read-only (disk full or drained); the client moves to another node"),
    pb.BAD_REQUEST: (NodeError, "node {node} refused a malformed or damaged request for ledger {ledger}"),
    pb.TOO_LARGE: (EntryRefusedError, "node {node} refused entry {entry} of ledger {ledger}: too large for it; no "
                                      "node is replaced for it and the writer stops: the entries acknowledged "
                                      "before it stay, those still waiting for acknowledgements fail with it. "
                                      "Close the ledger and write on in a new one, with entries the nodes take"),
    pb.ERROR: (NodeError, "node {node} failed on ledger {ledger}; check the node's log"),
    pb.STATUS_UNKNOWN: (NodeError, "node {node} sent no status for ledger {ledger}: broken peer"),
}


_STATUS_NAMES = {number: name for name, number in pb.Status.items()}


def status_name(status: int) -> str:
    """A node's status by name; one this client does not know (a newer node's, or a damaged message) by number.
    (pb.Status.Name raises on an unknown value, and names a value past int32 by its low 32 bits.)"""
    return _STATUS_NAMES.get(status) or f"status {status}"


def refuses_ledger(status: int) -> bool:
    """Whether status refuses the ledger itself (FENCED, UNAUTHORIZED): every node of it answers alike, so an op
    fails with error_for_status(status) rather than trying another node. Any other status is about the node
    that answered, or a negative the op weighs itself (rule 11)."""
    return status in REFUSALS


def check_entry_sizes(payloads, limit: int, overhead: int = 0) -> None:
    """Raise EntryTooLargeError, naming the first entry over limit (with overhead bytes the client adds to each),
    before any of payloads (a sequence) is sent: an entry the nodes would refuse must not cost the ledger its
    writer."""
    if not payloads or max(map(len, payloads)) + overhead <= limit:
        return
    for index, payload in enumerate(payloads):
        size = len(payload) + overhead
        if size > limit:
            where = f"entry {index} of the batch" if len(payloads) > 1 else "the entry"
            raise EntryTooLargeError(
                f"{where} is {size:,} bytes, over the {limit:,} bytes an entry may have (the storage nodes' "
                "--max-entry-bytes, and this client's max_entry_bytes): nothing was appended. Split it into "
                "smaller entries, or raise both limits")


def error_for_status(status: int, *, node: str, ledger: int, entry: int = -1, detail: str = "") -> LedgerError:
    """The exception for a node's status; detail (the node's message, say) is added unless it is the message."""
    cls, template = _STATUS_ERRORS.get(status, _STATUS_ERRORS[pb.STATUS_UNKNOWN])
    message = template.format(node=node, ledger=ledger, entry=entry)
    return cls(f"{message} ({detail})" if detail and detail != message else message)
