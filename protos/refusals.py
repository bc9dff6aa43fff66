"""The wording of a storage node's refusals of a ledger, written once for both ends of the wire.

FENCED (rule 6) and UNAUTHORIZED (rule 7) refuse the ledger itself, not one request or one node: every node
of the ledger answers alike. A node sends the text below as its response's message; the client raises the
same text (connector/client/errors.py, the status -> exception table). It lives with the wire protocol
because storage_node and connector never import each other (DESIGN section 2).
"""
from __future__ import annotations

from protos import ledger_pb2 as pb

# status -> its message, with {ledger} for the ledger id
REFUSALS: dict[int, str] = {
    pb.FENCED: ("ledger {ledger} is fenced: another client recovered it; an entry not acknowledged to this writer may "
                "be in it or not (the recovery decides: read the ledger to know) before you write it again; create a "
                "new ledger"),
    pb.UNAUTHORIZED: "wrong password for ledger {ledger}; open it with the password it was created with",
}


def refusal(status: int, ledger_id: int) -> tuple[int, str]:
    """(status, message): a node's refusal of ledger_id with status, FENCED or UNAUTHORIZED."""
    return status, REFUSALS[status].format(ledger=ledger_id)
