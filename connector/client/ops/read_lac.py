"""Reading the last add confirmed from the nodes of the last fragment, optionally fencing (rule 10). Pure.

Done as soon as the answering nodes reach quorum coverage of the ensemble; the LAC is the highest one
among them, a lower bound of the writer's. With fence=True a node that answers has fenced the ledger (a
node that never saw the ledger creates it fenced, rule 6), so coverage means no ack quorum of any entry
is left unfenced and the old writer cannot complete another add.
"""
from __future__ import annotations

from connector.client.errors import (
    NodeError, RecoveryIncompleteError, answered, error_for_status, refuses_ledger, status_name,
)
from connector.client.schedule import Schedule


class ReadLacOp:
    def __init__(self, ledger_id: int, schedule: Schedule, ensemble: tuple[str, ...], fence: bool):
        self.ledger_id = ledger_id
        self.schedule = schedule
        self.ensemble = tuple(ensemble)
        self.fence = fence
        self.answered: set[int] = set()
        self.unknown: dict[str, str] = {}
        self.refusals: dict[str, int] = {}  # node -> a status that refuses the ledger itself (wrong password)
        self.last_add_confirmed = -1
        self.last_entry_id = -1

    def requests(self) -> tuple[str, ...]:
        return self.ensemble

    @property
    def covered(self) -> bool:
        return self.schedule.covered(self.answered)

    @property
    def done(self) -> bool:
        return self.covered or len(self.answered) + len(self.unknown) == len(self.ensemble)

    def on_response(self, node: str, status: int, last_entry_id: int = -1, last_add_confirmed: int = -1,
                    message: str = "") -> None:
        if answered(status):
            self.answered.update(i for i, n in enumerate(self.ensemble) if n == node)
            self.last_add_confirmed = max(self.last_add_confirmed, last_add_confirmed)
            self.last_entry_id = max(self.last_entry_id, last_entry_id)
        else:
            if refuses_ledger(status):
                self.refusals.setdefault(node, status)
            self.on_failure(node, f"{status_name(status)} {message}".strip())

    def on_failure(self, node: str, reason: str) -> None:
        self.unknown.setdefault(node, reason)

    def outcome(self) -> int:
        """The LAC once covered; otherwise the error saying why coverage is out of reach."""
        if self.covered:
            return self.last_add_confirmed
        reasons = "; ".join(f"{n}: {r}" for n, r in sorted(self.unknown.items())) or "no answers yet"
        if self.refusals:  # a wrong password: no retry would get further
            node, status = min(self.refusals.items())
            raise error_for_status(status, node=node, ledger=self.ledger_id, detail=reasons)
        need = f"{len(self.ensemble)} nodes, E={self.schedule.ensemble_size} AQ={self.schedule.ack_quorum}"
        if self.fence:
            raise RecoveryIncompleteError(
                f"could not fence ledger {self.ledger_id} on enough nodes for quorum coverage ({need}): "
                f"{reasons}; nothing was closed, retry when the nodes are back")
        raise NodeError(
            f"could not read the LAC of ledger {self.ledger_id} from enough nodes ({need}): {reasons}")


class WaitLacOp(ReadLacOp):
    """A tailing reader's long poll of the last fragment's nodes (no fencing). A node answers as soon as its LAC
    passes previous, else at the end of its wait: so the op is done at the first LAC past previous, or once the
    answers reach quorum coverage (each waited and saw nothing newer), or when every node answered or failed. An
    error status is that node's failure (ReadLacOp), not "no news"."""

    def __init__(self, ledger_id: int, schedule: Schedule, ensemble: tuple[str, ...], previous: int):
        super().__init__(ledger_id, schedule, ensemble, fence=False)
        self.previous = previous

    @property
    def news(self) -> bool:
        return self.last_add_confirmed > self.previous

    @property
    def done(self) -> bool:
        return self.news or super().done

    def outcome(self) -> int:
        """The LAC past previous if a node knew one, else previous; the error of ReadLacOp.outcome if every node
        answered or failed without reaching quorum coverage (an op given up earlier, a paused node's answer
        still out, says no news)."""
        if self.news:
            return self.last_add_confirmed
        if super().done and not self.covered:
            super().outcome()
        return self.previous
