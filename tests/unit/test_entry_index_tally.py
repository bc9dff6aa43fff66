"""Each LedgerIndex keeps the bytes it points to per file (bytes_by_file) as it changes, so that compaction's
live bytes and the moves out of the files it rewrites take no pass over every entry a node holds. Checked against
the pass over every slot that compaction made before (its oracle here), through every kind of change: new runs,
entries one by one, overwrites of stored slots (a recovery add, a compaction move), holes and the overflow dict,
and an index loaded from a snapshot."""
from __future__ import annotations

from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from storage_node.checkpoint import decode_snapshot, encode_snapshot
from storage_node.compaction import moves_out_of
from storage_node.entry_index import (
    _FREE_HOLES, ABSENT, HOLES_PER_ENTRY, LedgerIndex, LiveBytes, OverflowRuns, file_of, pack,
)
from storage_node.ledger_state import LedgerState
from storage_node.segments import Position


def every_record(index: LedgerIndex) -> list[tuple[int, int, int]]:
    """(entry id, location, length) of every stored entry, slot by slot: the oracle."""
    dense = [(index.base + slot, location, length)
             for slot, (location, length) in enumerate(zip(index.locations, index.lengths)) if location != ABSENT]
    return dense + [(entry_id, location, length) for entry_id, (location, length) in index.overflow.items()]


def tally_of(records) -> dict[int, int]:
    live: dict[int, int] = {}
    for _, location, length in records:
        live[file_of(location)] = live.get(file_of(location), 0) + length
    return live


# One change: a run of `count` entries from entry `first` in file `number` (or put one by one), the far ones (every
# third) beyond the dense window.
changes = st.lists(st.tuples(st.integers(0, 400), st.integers(1, 30), st.integers(1, 6), st.booleans()),
                   max_size=25)


def apply(index: LedgerIndex, changes, far: int) -> None:
    offset = 0
    for n, (first, count, number, as_run) in enumerate(changes):
        first = first + far if n % 3 == 2 else first
        lengths = [10 + (n + i) % 50 for i in range(count)]
        # Records one after another (a journal group's run); now and then a run with gaps between its records,
        # or whose second half lies in the next file.
        gap = 7 if n % 5 == 4 else 0
        starts = [offset + sum(lengths[:i]) + gap * i for i in range(count)]
        locations = [pack(number + (n % 4 == 3 and 2 * i >= count), start) for i, start in enumerate(starts)]
        offset = starts[-1] + lengths[-1]
        if as_run:
            index.put_run(first, array("q", locations), lengths)
        else:
            for i in range(count):
                index.put(first + i, locations[i], lengths[i])


@settings(max_examples=300, deadline=None)
@given(changes, st.sampled_from([0, 5_000, 1 << 40]))
def test_the_tally_matches_a_pass_over_every_slot(change_list, far):
    index = LedgerIndex()
    apply(index, change_list, far)
    records = every_record(index)
    assert index.bytes_by_file == tally_of(records)
    assert index.count == len(records)
    assert_spans_hold_every_dense_record(index)
    assert not [e for e in index.overflow if 0 <= e - index.base < len(index.locations)]   # in one place only
    loaded = LedgerIndex(index.base)
    loaded.locations, loaded.lengths, loaded.overflow = array("q", index.locations), array("i", index.lengths), \
        OverflowRuns(dict(index.overflow))
    loaded.recount()
    assert (loaded.bytes_by_file, loaded.count) == (index.bytes_by_file, index.count)
    assert_spans_hold_every_dense_record(loaded)
    # A loaded index's spans are exact: the lowest and highest slot of each file's records.
    for number, (low, high) in loaded.slots_by_file.items():
        in_file = [slot for slot, location in enumerate(loaded.locations)
                   if location != ABSENT and file_of(location) == number]
        assert (low, high) == (in_file[0], in_file[-1])


def assert_spans_hold_every_dense_record(index: LedgerIndex) -> None:
    for slot, location in enumerate(index.locations):
        if location != ABSENT:
            low, high = index.slots_by_file[file_of(location)]
            assert low <= slot <= high
    assert set(index.slots_by_file) <= set(index.bytes_by_file)


@settings(max_examples=200, deadline=None)
@given(st.lists(changes, min_size=1, max_size=4), st.sets(st.integers(1, 7)), st.sampled_from([0, 1 << 40]))
def test_live_bytes_and_moves_match_the_pass_over_every_slot(ledger_changes, sources, far):
    """The node's LiveBytes, counting ledgers from their creation (even ids) or from after their changes (odd ids,
    as replay's ledgers), and the moves out of the files it says they hold records in; a dropped ledger leaves it,
    and changes to it afterwards (a group applied after the drop) are not counted."""
    live = LiveBytes()
    ledgers = []
    for ledger_id, change_list in enumerate(ledger_changes):
        ledgers.append(LedgerState(ledger_id, b"k" * 32))
        if ledger_id % 2 == 0:
            live.attach(ledgers[-1].index, ledgers[-1])
        apply(ledgers[-1].index, change_list, far)
        if ledger_id % 2 == 1:
            live.attach(ledgers[-1].index, ledgers[-1])
    dropped = ledgers.pop()
    live.detach(dropped.index)
    apply(dropped.index, ledger_changes[0], far)
    expected_live: dict[int, int] = {}
    expected_moves = []
    for state in ledgers:
        records = every_record(state.index)
        for number, size in tally_of(records).items():
            expected_live[number] = expected_live.get(number, 0) + size
        expected_moves += [(state.ledger_id, *record) for record in records if file_of(record[1]) in sources]
    assert live.by_file == expected_live
    holding = live.holding(sources)
    assert sorted(state.ledger_id for state in holding) == sorted({move[0] for move in expected_moves})
    moves = moves_out_of(holding, sources)
    assert sorted((m.state.ledger_id, m.entry_id, m.location, m.length) for m in moves) == sorted(expected_moves)
    assert [m.location for m in moves] == sorted(m.location for m in moves)


def test_a_snapshot_loads_with_the_tally_of_what_it_holds():
    state = LedgerState(3, b"k" * 32)
    state.index.put_run(0, array("q", [pack(1, 0), pack(1, 60)]), [60, 40])
    state.index.put(5, pack(2, 0), 30)                  # a hole at 2..4
    state.index.put(1 << 40, pack(4, 0), 20)            # the overflow dict
    state.index.put(1, pack(3, 0), 40)                  # moved (compaction): file 1 keeps 60 bytes
    _, ledgers = decode_snapshot(bytes(encode_snapshot(Position(1, 0), {3: state}, generation=1)))
    assert ledgers[3].index.bytes_by_file == {1: 60, 2: 30, 3: 40, 4: 20} == state.index.bytes_by_file
    assert ledgers[3].index.count == 4


def test_a_file_whose_last_record_moved_leaves_the_tally():
    index = LedgerIndex()
    index.put(0, pack(1, 0), 50)
    index.put(0, pack(2, 0), 50)
    assert index.bytes_by_file == {2: 50}
    assert list(index.records_in({1})) == []


def held_once(index: LedgerIndex) -> bool:
    window = {index.base + slot for slot, location in enumerate(index.locations) if location != ABSENT}
    return not window & set(index.overflow)


def test_an_overflow_entry_the_window_grows_over_moves_into_it_and_is_never_held_twice():
    """Found by review: an entry put far ahead went to the overflow; once the window grew past its id, a
    compaction move put it into its dense slot and the overflow record stayed. Its old file kept a tally (never
    deleted, its record moved again every round), the count was one too high and ranges listed the id twice.
    (A far entry now moves the window instead; an index loaded from a checkpoint of before holds such entries.)"""
    index = LedgerIndex()
    index.put(0, pack(1, 0), 100)
    index.overflow.put(5_000, pack(1, 100), 50)            # far ahead, as a checkpoint of before held it
    index.recount()
    index.put_run(1, array("q", [pack(2, 0)]), [10])
    for entry_id in range(2, 4_999, 20):                   # the window grows up to it...
        index.put(entry_id, pack(2, 10 * entry_id), 10)
    index.put(5_100, pack(2, 99_000), 10)                  # ...and past it: it moves into its slot
    assert index.get(5_000) == (pack(1, 100), 50) and held_once(index)
    index.put(5_000, pack(3, 0), 50)                       # a compaction move
    assert index.bytes_by_file.get(1) == 100 and index.bytes_by_file[3] == 50
    assert list(index.entries_between(4_990, 5_010)) == [5_000]
    assert index.count == len(every_record(index)) == 254 and held_once(index)


def test_a_run_over_an_overflow_entry_replaces_it():
    index = LedgerIndex()
    index.put(0, pack(1, 0), 100)
    index.overflow.put(3_000, pack(1, 100), 50)            # far ahead, as a checkpoint of before held it
    index.recount()
    for entry_id in range(20, 2_981, 20):                  # the window grows towards it
        index.put(entry_id, pack(3, entry_id), 5)
    run = range(2_990, 3_010)                              # records one after another: put in one step
    index.put_run(run[0], array("q", [pack(4, 20 * n) for n in run]), [20] * len(run))
    assert index.get(3_000) == (pack(4, 20 * 3_000), 20) and held_once(index)
    assert index.bytes_by_file[1] == 100
    assert index.count == len(every_record(index)) == 170
    assert index.bytes_by_file == tally_of(every_record(index))


def test_an_entry_far_above_the_window_moves_it_and_later_entries_are_dense_again():
    """Growth audit: the window grew by at most 65,536 holes, and every id it could not take went to a dict (about
    205 bytes an entry, and a range read scanned all of it): a node chosen again for a ledger written without it
    for 70,000 entries put every later entry of that ledger there, and a re-replication's copy of an earlier
    fragment onto a node holding a later one put every copied entry there."""
    index = LedgerIndex()
    index.put_run(0, array("q", [pack(1, 10 * n) for n in range(1_000)]), [10] * 1_000)
    index.mark_checkpointed()
    far = 71_010                                            # chosen again 70,010 entries later
    for start in range(far, far + 3_000, 100):
        index.put_run(start, array("q", [pack(2, 10 * (n - far)) for n in range(start, start + 100)]), [10] * 100)
    assert index.base == far and len(index.locations) == 3_000   # the new entries are dense
    assert len(index.overflow) == 1_000 and index.overflow._firsts == [0]   # the old window, as one run
    assert index.rewritten() and index.changes()[0] == 0   # a checkpoint writes it whole
    for n in range(990, 1_000):                             # a re-replication copies an earlier fragment below it
        index.put(n - 990 + 40_000, pack(3, 10 * n), 10)
    assert len(index.overflow._firsts) == 2 and index.count == 4_010 == len(every_record(index)) and held_once(index)
    assert list(index.entries_between(995, 40_002)) == [*range(995, 1_000), 40_000, 40_001, 40_002]
    assert index.get(71_500) == (pack(2, 4_900), 10) and index.get(500) == (pack(1, 5_000), 10)
    assert index.bytes_by_file == tally_of(every_record(index))
    assert sorted(r[0] for r in index.records_in({3})) == list(range(40_000, 40_010))


def test_a_loaded_index_that_holds_an_entry_twice_keeps_the_record_get_answered():
    """A snapshot written before the fix above may hold an id in both places; loading keeps one."""
    index = LedgerIndex(0)
    index.locations, index.lengths = array("q", [pack(1, 0), ABSENT, pack(2, 0)]), array("i", [10, 0, 30])
    index.overflow = OverflowRuns({1: (pack(5, 0), 20), 2: (pack(5, 20), 40), 9_000: (pack(6, 0), 7)})
    index.recount()
    assert index.get(9_000) == (pack(6, 0), 7) and held_once(index)
    assert [index.get(e) for e in (0, 1, 2)] == [(pack(1, 0), 10), (pack(5, 0), 20), (pack(2, 0), 30)]
    assert (index.count, index.bytes_by_file) == (4, {1: 10, 5: 20, 2: 30, 6: 7})


def test_an_index_of_the_version_before_with_entries_above_its_window_loses_none_as_windows_move():
    """Review: a node of the version before put entries far above its window into its dict; loaded into runs, a
    put into a hole among them moved the window inside that run, and the next move adopted it as a run overlapping
    the other: get(5003) answered None for an entry the node held (rule 8). Loading now puts every overflow id below
    the window, and the first checkpoint after a change writes the index whole."""
    index = LedgerIndex(0)
    index.locations = array("q", [pack(1, 10 * n) for n in range(11)])
    index.lengths = array("i", [10] * 11)
    index.overflow = OverflowRuns({5_000: (pack(2, 0), 10), 5_003: (pack(2, 10), 10), 5_006: (pack(2, 20), 10)})
    index.recount()
    index.mark_checkpointed()
    assert index.base > 5_006 and index.rewritten()
    index.put(5_001, pack(3, 0), 10)       # a recovery add into a hole among the old entries
    index.put(200_000, pack(4, 0), 10)     # far above
    index.put(300_000, pack(4, 10), 10)    # and again: the window [200000] is adopted as a run
    expected = {n: (pack(1, 10 * n), 10) for n in range(11)}
    expected.update({5_000: (pack(2, 0), 10), 5_001: (pack(3, 0), 10), 5_003: (pack(2, 10), 10),
                     5_006: (pack(2, 20), 10), 200_000: (pack(4, 0), 10), 300_000: (pack(4, 10), 10)})
    assert {e: index.get(e) for e in expected} == expected and index.count == len(expected) and held_once(index)
    assert list(index.entries_between(0, 1 << 40)) == sorted(expected)
    assert index.bytes_by_file == tally_of(every_record(index))


def test_a_range_iterated_while_the_window_moves_yields_what_it_started_on():
    """Review: a ReadRange sends messages while it iterates entries_between, and puts land meanwhile; the window
    read its base and arrays at every step, so once it moved the rest of the range came out as ids of the new
    window ([298, 299, 100300, ...]) and the stored 300..999 were left out, with the range reported done."""
    index = LedgerIndex()
    index.put_run(0, array("q", [pack(1, 10 * n) for n in range(1_000)]), [10] * 1_000)
    ids = index.entries_between(0, 99_999)
    got = [next(ids) for _ in range(300)]
    index.put_run(100_000, array("q", [pack(2, 10 * n) for n in range(1_000)]), [10] * 1_000)   # the window moves
    got += list(ids)
    assert got == list(range(1_000))
    assert all(index.get(e) == (pack(1, 10 * e), 10) for e in got)


# One step of an index's life: puts of `count` entries from `offset` past the window's first id (below it: the
# overflow) into file `number`; an entry far above the window (it moves to the overflow); a compaction round
# moving the records of file `number` into a new file; a restart (the index loaded from a snapshot).
index_steps = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(-300, 400), st.integers(1, 30), st.integers(1, 6)),
    st.tuples(st.just("far"), st.integers(1, 3), st.integers(1, 6)),
    st.tuples(st.just("compact"), st.integers(1, 12)),
    st.tuples(st.just("restart"),),
), max_size=30)


def live_index(steps) -> LedgerIndex:
    state = LedgerState(3, b"k" * 32)
    for n, (kind, *args) in enumerate(steps):
        index = state.index
        if kind == "put":
            offset, count, number = args
            first = max(0, max(0, index.base) + offset)
            for i in range(count):
                index.put(first + i, pack(number, 1_000 * n + 10 * i), 10 + (n + i) % 7)
        elif kind == "far":
            distance, number = args
            far = index.base + len(index.locations) + distance * (_FREE_HOLES + HOLES_PER_ENTRY * index.count + 1)
            index.put(far, pack(number, 1_000 * n), 10)
        elif kind == "compact":
            (number,) = args
            for offset, (entry_id, _, length) in enumerate(index.records_in({number})):
                index.put(entry_id, pack(100 + n, 100 * offset), length)
        else:
            _, ledgers = decode_snapshot(bytes(encode_snapshot(Position(1, 0), {3: state}, generation=1)))
            state = ledgers[3]
    return state.index


@settings(max_examples=300, deadline=None)
@given(index_steps, st.sets(st.integers(1, 140), max_size=4))
def test_records_in_finds_what_a_pass_over_every_entry_finds(steps, files):
    """records_in searches only the ids each file's records lie among (slots_by_file, and ids_by_file in the
    overflow, which keeps the windows that moved); the oracle is the pass over every entry, window then overflow."""
    index = live_index(steps)
    for number, (low, high) in index.overflow.ids_by_file.items():
        assert number in index.bytes_by_file and low <= high
    for entry_id, (location, _) in index.overflow.items():
        low, high = index.overflow.ids_by_file[file_of(location)]
        assert low <= entry_id <= high
    for wanted in [files, *({number} for number in index.bytes_by_file)]:
        assert index.records_in(wanted) == [r for r in every_record(index) if file_of(r[1]) in wanted]
    assert index.bytes_by_file == tally_of(every_record(index))


def test_records_in_a_moved_window_looks_only_at_the_ids_of_the_files_asked_for():
    """Review: after a window moved, records_in scanned the whole overflow for every file asked for (26 ms for a
    window of 10 million entries, at every compaction round that rewrote a file the ledger had a record in)."""
    index = LedgerIndex()
    for number in (1, 2, 3):                                 # 1,000 entries in each of three files, in order
        first = 1_000 * (number - 1)
        index.put_run(first, array("q", [pack(number, 10 * n) for n in range(1_000)]), [10] * 1_000)
    index.put(1 << 30, pack(4, 0), 10)                      # far above: the window moves to the overflow
    assert index.overflow.ids_by_file == {1: [0, 999], 2: [1_000, 1_999], 3: [2_000, 2_999]}
    index.put(1_500, pack(5, 0), 10)                        # a compaction move out of file 2
    assert index.overflow.ids_by_file[5] == [1_500, 1_500]
    assert [r[0] for r in index.records_in({5, 4})] == [1 << 30, 1_500]
    assert len(index.records_in({2})) == 999
    for entry_id in range(1_000, 2_000):                    # file 2 loses its last record: it is forgotten
        index.put(entry_id, pack(6, 10 * entry_id), 10)
    assert 2 not in index.overflow.ids_by_file and index.records_in({2}) == []
