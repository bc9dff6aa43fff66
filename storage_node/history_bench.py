"""`ledger bench history`, its node section: what a storage node's own history costs its event loop.

Run by connector/bench/history.py as `python -m storage_node.history_bench --entries N --rounds R` (the connector
and the storage node never import each other); exit status 1 if a target is missed.

Two in-memory indexes, built as a node's journal groups build them (runs of RUN entries of LEDGERS ledgers taken
in turn, 1 KiB entries, journal segments of the node's default size, or smaller so that the smaller history spans
four): one of --entries entries (`ledger bench history --node-entries`), one of a tenth of them. Both have the
same compaction work: in their first segment two runs in three belong to ledgers that were deleted, so a round
rewrites that segment and moves the same live records out of it. Measured, each a median of --rounds after WARM_UP:

- a garbage-collection round's compaction planning, on the event loop: live bytes per file, the plan, and the
  records to move out of the files it rewrites (storage.compact does these before it copies anything); target:
  <= TARGET times the smaller history's;
- a checkpoint after the same changes (a run of new entries in each of DELTA_LEDGERS ledgers): a delta, encoded
  on the event loop (storage.checkpoint); target <= TARGET times the smaller history's. Beside it the whole
  snapshot that Storage writes once the deltas since the last one add up to its size, and what that costs
  amortised over those deltas: the event loop copies what it holds, a worker thread frames and writes it.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from array import array
from typing import Callable

from storage_node.checkpoint import encode_delta, encode_snapshot
from storage_node.compaction import moves_out_of, plan_compaction
from storage_node.config import NodeConfig
from storage_node.entry_index import LiveBytes, pack
from storage_node.ledger_state import LedgerState
from storage_node.records import ENTRY_PAYLOAD_OFFSET
from storage_node.segments import Position
from storage_node.storage import MAX_DELTAS

LEDGERS = 1_000
RUN = 128                                   # entries of one ledger per journal group
RECORD_BYTES = ENTRY_PAYLOAD_OFFSET + 1024  # a 1 KiB entry's journal record
THRESHOLD = NodeConfig.compaction_threshold   # the storage node's default --compaction-threshold
DEAD_RUNS = 2                               # of every three runs in the first segment
DELTA_LEDGERS = 100                         # ledgers with a new run between two checkpoints
_LENGTHS = array("i", [RECORD_BYTES]) * RUN
MiB = 1 << 20
TARGET = 1.3
WARM_UP = 2


class NodeHistory:
    """The ledger states of a node that holds `entries` entries, and its sealed files' sizes."""

    def __init__(self, entries: int, segment_bytes: int):
        self.ledgers = {ledger_id: LedgerState(ledger_id, b"k" * 32) for ledger_id in range(LEDGERS)}
        self.live = LiveBytes()                 # as Storage keeps it
        for state in self.ledgers.values():
            self.live.attach(state.index, state)
        self.sizes: dict[int, int] = {}
        self.segment_bytes = segment_bytes
        self.segment, self.offset, self.entries, turn = 1, 0, 0, 0
        self.next_entry = [0] * LEDGERS
        while self.entries < entries:
            turn += 1
            if self.segment == 1 and turn % 3 < DEAD_RUNS:
                self.offset += RUN * RECORD_BYTES        # a deleted ledger's run: its bytes stay in the file
                continue
            self.append_run(turn % LEDGERS)
        for state in self.ledgers.values():
            state.index.mark_checkpointed()

    def append_run(self, ledger_id: int) -> LedgerState:
        """A journal group's run of RUN entries of the ledger, as Storage._apply indexes it."""
        if self.offset + RUN * RECORD_BYTES > self.segment_bytes:
            self.sizes[self.segment] = self.offset
            self.segment, self.offset = self.segment + 1, 0
        state = self.ledgers[ledger_id]
        locations = array("q", itertools.accumulate(_LENGTHS, initial=pack(self.segment, self.offset)))
        locations.pop()
        state.index.put_run(self.next_entry[ledger_id], locations, _LENGTHS)
        self.next_entry[ledger_id] += RUN
        self.offset += RUN * RECORD_BYTES
        self.entries += RUN
        return state

    def plan_round(self) -> int:
        """What storage.compact works out on the event loop before it copies; the number of records to move."""
        plan = plan_compaction(self.sizes, self.live.by_file, THRESHOLD)
        return len(moves_out_of(self.live.holding(plan.rewrite), set(plan.rewrite)))

    def whole_checkpoint(self) -> int:
        """The bytes of a whole snapshot, encoded as Storage.checkpoint does on the event loop (copied: a worker thread
        frames and writes it)."""
        return encode_snapshot(self._position(), self.ledgers, generation=1).size

    def delta_checkpoint(self) -> int:
        """One run of new entries in each of DELTA_LEDGERS ledgers, then the delta that holds them; its bytes."""
        changed = [self.append_run(ledger_id) for ledger_id in range(0, LEDGERS, LEDGERS // DELTA_LEDGERS)]
        blob = encode_delta(self._position(), 1, 1, changed, ())
        for state in changed:
            state.index.mark_checkpointed()
        return blob.size

    def _position(self) -> Position:
        return Position(self.segment, self.offset)


def compare(entries: int, rounds: int, target: float) -> bool:
    # Segments of the node's default size, or smaller so that the smaller history spans four of them.
    segment_bytes = min(NodeConfig.journal_segment_bytes, max(entries // 10, RUN) * RECORD_BYTES // 4)
    small, large = NodeHistory(max(entries // 10, RUN), segment_bytes), NodeHistory(entries, segment_bytes)
    held = small.entries, large.entries
    moves_small, moves_large = small.plan_round(), large.plan_round()
    plan_small, plan_large = _alternating(small.plan_round, large.plan_round, rounds)
    met = _line(f"node: a garbage-collection round's compaction planning on the event loop (live bytes per file, "
                f"plan, records to move), {moves_small:,} and {moves_large:,} records to move (segments of "
                f"{segment_bytes / MiB:,.0f} MiB)", held, plan_small, plan_large, target)
    delta_small, delta_large = _alternating(small.delta_checkpoint, large.delta_checkpoint, rounds)
    met &= _line(f"node: a checkpoint after {DELTA_LEDGERS * RUN:,} new entries in {DELTA_LEDGERS} ledgers, a delta "
                 f"of {small.delta_checkpoint():,} and {large.delta_checkpoint():,} bytes, encoded on the event loop",
                 held, delta_small, delta_large, target)
    whole_small, whole_large = _alternating(small.whole_checkpoint, large.whole_checkpoint, rounds)
    whole_bytes, delta_bytes = large.whole_checkpoint(), large.delta_checkpoint()
    print(f"node: a whole snapshot (written when the deltas since the last one add up to its size), copied on the "
          f"event loop (a worker thread frames and writes it): "
          f"{_ms(whole_small)} ({small.whole_checkpoint():,} bytes) and {_ms(whole_large)} ({whole_bytes:,} bytes); "
          f"on the larger node one in every {min(MAX_DELTAS, whole_bytes // delta_bytes + 1):,} checkpoints of "
          f"this delta's size, {_ms(whole_large / min(MAX_DELTAS, whole_bytes // delta_bytes + 1))} each amortised",
          flush=True)
    return met


def _line(what: str, held: tuple[int, int], small_seconds: float, large_seconds: float, target: float) -> bool:
    ratio = large_seconds / small_seconds
    met = ratio <= target
    print(f"{what}: {_ms(small_seconds)} on a node of {held[0]:,} entries, {_ms(large_seconds)} on one of "
          f"{held[1]:,}; ratio {ratio:.2f} (target <= {target}: {'met' if met else 'MISSED'})", flush=True)
    return met


def _alternating(first: Callable[[], object], second: Callable[[], object], rounds: int) -> tuple[float, float]:
    """Median seconds of each, called in turn WARM_UP + rounds times (the first WARM_UP not counted)."""
    spent: tuple[list[float], list[float]] = ([], [])
    for _ in range(WARM_UP + rounds):
        for fn, times in zip((first, second), spent):
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
    return statistics.median(spent[0][WARM_UP:]), statistics.median(spent[1][WARM_UP:])


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m storage_node.history_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=10_000_000, help="entries of the larger node history")
    parser.add_argument("--rounds", type=int, default=30, help="measured rounds of each figure")
    args = parser.parse_args(argv)
    if args.entries < 10 * RUN or args.rounds < 1:
        parser.error(f"--entries must be at least {10 * RUN} and --rounds at least 1")
    return 0 if compare(args.entries, args.rounds, TARGET) else 1


if __name__ == "__main__":
    sys.exit(main())
