"""`ledger bench history`, its node section: what a storage node's own history costs its event loop.

Two in-memory indexes, built as a node's journal groups build them (runs of RUN entries of LEDGERS ledgers taken
in turn, 1 KiB entries, journal segments of the node's default size): one of --node-entries entries, one of a
tenth of them. Both have the same compaction work: in their first segment two runs in three belong to ledgers
that were deleted, so a round rewrites that segment and moves the same live records out of it. Measured, each a
median of --rounds after history.WARM_UP:

- a garbage-collection round's compaction planning, on the event loop: live bytes per file, the plan, and the
  records to move out of the files it rewrites (storage.compact does these before it copies anything); target:
  <= TARGET times the smaller history's;
- a checkpoint's encoding, also on the event loop (storage.checkpoint): printed with its ratio. It encodes the
  whole index, so it grows with what the node holds (README, known limits).
"""
from __future__ import annotations

import itertools
from array import array

from connector.bench.history import _alternating, _ms
from storage_node.checkpoint import encode_snapshot
from storage_node.compaction import live_bytes_by_file, moves_out_of, plan_compaction
from storage_node.config import NodeConfig
from storage_node.entry_index import pack
from storage_node.ledger_state import LedgerState
from storage_node.records import ENTRY_PAYLOAD_OFFSET
from storage_node.segments import Position

LEDGERS = 1_000
RUN = 128                                   # entries of one ledger per journal group
RECORD_BYTES = ENTRY_PAYLOAD_OFFSET + 1024  # a 1 KiB entry's journal record
THRESHOLD = 0.5                             # storage node's default --compaction-threshold
DEAD_RUNS = 2                               # of every three runs in the first segment


class NodeHistory:
    """The ledger states of a node that holds `entries` entries, and its sealed files' sizes."""

    def __init__(self, entries: int, segment_bytes: int = NodeConfig.journal_segment_bytes):
        self.ledgers: dict[int, LedgerState] = {}
        self.sizes: dict[int, int] = {}
        segment, offset, written, turn = 1, 0, 0, 0
        next_entry = [0] * LEDGERS
        lengths = array("i", [RECORD_BYTES]) * RUN
        while written < entries:
            if offset + RUN * RECORD_BYTES > segment_bytes:
                self.sizes[segment] = offset
                segment, offset = segment + 1, 0
            ledger_id = turn % LEDGERS
            turn += 1
            if segment == 1 and turn % 3 < DEAD_RUNS:
                offset += RUN * RECORD_BYTES        # a deleted ledger's run: its bytes stay in the file
                continue
            state = self.ledgers.get(ledger_id)
            if state is None:
                state = self.ledgers[ledger_id] = LedgerState(ledger_id, b"k" * 32)
            locations = array("q", itertools.accumulate(lengths, initial=pack(segment, offset)))
            locations.pop()
            state.index.put_run(next_entry[ledger_id], locations, lengths)
            next_entry[ledger_id] += RUN
            offset += RUN * RECORD_BYTES
            written += RUN
        self.entries = written

    def plan_round(self) -> int:
        """What storage.compact works out on the event loop before it copies; the number of records to move."""
        plan = plan_compaction(self.sizes, live_bytes_by_file(self.ledgers.values()), THRESHOLD)
        return len(moves_out_of(list(self.ledgers.values()), set(plan.rewrite)))

    def checkpoint_bytes(self) -> int:
        return len(encode_snapshot(Position(max(self.sizes, default=1) + 1, 0), self.ledgers))


def compare(entries: int, rounds: int, target: float) -> bool:
    small, large = NodeHistory(max(entries // 10, RUN)), NodeHistory(entries)
    moves_small, moves_large = small.plan_round(), large.plan_round()
    plan_small, plan_large = _alternating(small.plan_round, large.plan_round, rounds)
    met = plan_large <= target * plan_small
    print(f"node: a garbage-collection round's compaction planning on the event loop (live bytes per file, plan, "
          f"records to move), {moves_small:,} and {moves_large:,} records to move: {_ms(plan_small)} on a node of "
          f"{small.entries:,} entries, {_ms(plan_large)} on one of {large.entries:,}; ratio "
          f"{plan_large / plan_small:.2f} (target <= {target}: {'met' if met else 'MISSED'})", flush=True)
    encode_small, encode_large = _alternating(small.checkpoint_bytes, large.checkpoint_bytes, rounds)
    print(f"node: a checkpoint's encoding on the event loop: {_ms(encode_small)} ({small.checkpoint_bytes():,} bytes) "
          f"and {_ms(encode_large)} ({large.checkpoint_bytes():,} bytes); ratio {encode_large / encode_small:.2f} "
          f"(grows with the entries held: each checkpoint writes the whole index)", flush=True)
    return met
