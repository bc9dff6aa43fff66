"""Recovery reads (rules 11-12): deciding, entry by entry past the LAC, what the old writer may have had
acknowledged. Pure.

Fencing ReadRange calls go to every node of the last fragment, a window of entries at a time, several windows
in flight. An entry is positive as soon as one node returns it with a valid digest; negative only when
(WQ - AQ) + 1 nodes of its write set finished their range without it (or answered NO_LEDGER); if neither can
still happen it is unknown and the attempt aborts: never close on unknown (rule 13). The first negative entry
ends the ledger at the entry before it. A window counts as finished only when the node said so (its done
marker); a stream that ended early leaves what it did not return unknown.

What happens next lives elsewhere: the write-back (runner/add.py, recovery=True) keeps its ensemble changes
in memory, and close.close_recovered stores them in the compare-and-set that closes (rule 12).
"""
from __future__ import annotations

import dataclasses

from connector.client.errors import RecoveryIncompleteError, answered, status_name
from connector.client.ops.read import RangeCall, entry_problem
from connector.client.schedule import Schedule
from metadata.model import LedgerMetadata, LedgerState
from protos import ledger_pb2 as pb


@dataclasses.dataclass
class _Votes:
    payload: bytes | memoryview | None = None
    negative: set[str] = dataclasses.field(default_factory=set)
    unknown: dict[str, str] = dataclasses.field(default_factory=dict)


def recovery_start(meta: LedgerMetadata, highest_lac: int) -> int:
    """Rule 11: the last entry known to be confirmed; recovery reads from the one after it."""
    return max(highest_lac, meta.last_fragment.first_entry_id - 1)


def begin_recovery(meta: LedgerMetadata) -> LedgerMetadata | None:
    """Rule 10's first step, for update_ledger: OPEN -> IN_RECOVERY; an IN_RECOVERY or CLOSED ledger stays."""
    if meta.state is LedgerState.OPEN:
        return meta.replace(state=LedgerState.IN_RECOVERY)
    return None


class RecoveryReadOp:
    def __init__(self, ledger_id: int, schedule: Schedule, ensemble: tuple[str, ...], start: int, *,
                 first_window: int = 16, max_window: int = 1024, windows_in_flight: int = 2):
        self.ledger_id = ledger_id
        self.schedule = schedule
        self.ensemble = tuple(ensemble)  # the last fragment as fenced; write-back changes do not move it
        self.start = start
        self.votes: dict[int, _Votes] = {}
        self.decided = start            # every entry in (start, decided] is positive
        self.end: int | None = None     # the recovered last entry once a negative is found
        self.error: RecoveryIncompleteError | None = None
        self._issued = start
        self._window = first_window
        self._max_window = max_window
        self._windows_in_flight = windows_in_flight
        self._open_windows: list[tuple[int, int]] = []
        self._taken = start

    @property
    def done(self) -> bool:
        return self.end is not None or self.error is not None

    def requests(self) -> list[RangeCall]:
        """New windows to read, keeping a few in flight until the end is found."""
        calls = []
        while not self.done and len(self._open_windows) < self._windows_in_flight:
            first, last = self._issued + 1, self._issued + self._window
            self._issued = last
            self._window = min(self._window * 2, self._max_window)
            self._open_windows.append((first, last))
            for entry_id in range(first, last + 1):
                self.votes[entry_id] = _Votes()
            calls.extend(RangeCall(node, first, last) for node in self.ensemble)
        return calls

    def on_entry(self, node: str, entry: pb.ReadResponse) -> None:
        votes = self.votes.get(entry.entry_id)
        if votes is None or self.done:
            return
        payload = entry.payload
        problem = entry_problem(self.ledger_id, entry, payload)
        if problem:
            votes.unknown[node] = problem
        else:
            votes.payload = payload
        self._decide()

    def on_range_done(self, call: RangeCall, status: int = pb.OK, reason: str = "") -> None:
        """The node's answer to the whole window ended: entries it did not return are absent there (negative)
        only if it said done with OK or has no such ledger; any other ending (an error, a broken stream, a
        stream that ended without its done marker: STATUS_UNKNOWN) leaves them unknown (rule 11)."""
        for entry_id in range(call.first_entry_id, call.last_entry_id + 1):
            votes = self.votes.get(entry_id)
            if votes is None or votes.payload is not None or call.node in votes.unknown:
                continue
            if answered(status):
                votes.negative.add(call.node)
            else:
                votes.unknown[call.node] = reason or status_name(status)
        self._decide()

    def take_recovered(self) -> list[tuple[int, bytes | memoryview]]:
        """Positive entries not handed out yet, in entry order, for write-back."""
        taken = [(e, self.votes[e].payload) for e in range(self._taken + 1, self.decided + 1)]
        self._taken = self.decided
        for entry_id, _ in taken:
            del self.votes[entry_id]
        return taken

    def _decide(self) -> None:
        while not self.done and self.decided < self._issued:
            entry_id = self.decided + 1
            votes = self.votes[entry_id]
            write_set = self.schedule.write_set_nodes(entry_id, self.ensemble)
            if votes.payload is not None:
                self.decided = entry_id
                self._close_finished_windows()
                continue
            negatives = len(votes.negative & set(write_set))
            if negatives >= self.schedule.negative_threshold:
                self.end = entry_id - 1
                return
            if all(n in votes.negative or n in votes.unknown for n in write_set):
                self.error = RecoveryIncompleteError(
                    f"recovery of ledger {self.ledger_id} cannot decide entry {entry_id}: "
                    f"{negatives} of the {self.schedule.negative_threshold} 'no such entry' answers needed, "
                    f"unknown from {', '.join(f'{n} ({r})' for n, r in sorted(votes.unknown.items()))}; "
                    "nothing was closed, retry when the nodes are back"
                )
            return

    def _close_finished_windows(self) -> None:
        while self._open_windows and self._open_windows[0][1] <= self.decided:
            self._open_windows.pop(0)
