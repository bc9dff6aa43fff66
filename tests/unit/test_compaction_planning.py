"""Which ledgers a compaction rewrites and into how many (connector.compaction.runs_of): pure, no I/O."""
from connector.compaction import MAX_RUN_LEDGERS, Candidate, CompactionPolicy, runs_of
from metadata.model import StreamLedger

QUORUM = (3, 3, 2)


def candidates(*sizes, first_id: int = 100, quorum=QUORUM) -> list[Candidate]:
    """One candidate per size (bytes); a size of 0 is a ledger without rows. Offsets contiguous from 0."""
    out, offset = [], 0
    for n, size in enumerate(sizes):
        rows = 1 if size else 0
        out.append(Candidate(StreamLedger(first_id + n, offset, offset + rows - 1), size, quorum))
        offset += rows
    return out


def ids(runs) -> list[list[list[int]]]:
    return [[[c.ledger.ledger_id for c in group] for group in run] for run in runs]


def test_contiguous_small_ledgers_are_packed_into_groups_of_at_most_the_target():
    policy = CompactionPolicy(target_bytes=100)
    assert ids(runs_of(candidates(30, 30, 30, 30, 30, 30, 30, 30), policy)) == [
        [[100, 101, 102], [103, 104, 105], [106, 107]]]


def test_a_ledger_that_stays_or_a_change_of_quorums_ends_a_run():
    policy = CompactionPolicy(target_bytes=100)
    mixed = candidates(10, 10, 10, 10, 10, 10)
    mixed[2] = None
    mixed[5] = Candidate(mixed[5].ledger, 10, (3, 2, 2))
    assert ids(runs_of(mixed, policy)) == [[[100, 101]], [[103, 104]]]


def test_a_run_does_not_end_in_a_group_of_one_nor_start_or_end_with_a_ledger_without_rows():
    policy = CompactionPolicy(target_bytes=100, small_bytes=100)
    assert ids(runs_of(candidates(60, 30, 60, 30, 90), policy)) == [[[100, 101], [102, 103]]]
    assert ids(runs_of(candidates(0, 10, 10, 0, 10, 0), policy)) == [[[101, 102, 103, 104]]]
    assert ids(runs_of(candidates(90, 90, 90), policy)) == []


def test_runs_shorter_than_min_ledgers_are_left_alone():
    assert ids(runs_of(candidates(10, 10, 10), CompactionPolicy(target_bytes=100, min_ledgers=4))) == []
    assert ids(runs_of(candidates(10, 10, 10, 10), CompactionPolicy(target_bytes=100, min_ledgers=4))) == [
        [[100, 101, 102, 103]]]


def test_a_run_has_at_most_max_run_ledgers():
    runs = runs_of(candidates(*[1] * (MAX_RUN_LEDGERS + 10)), CompactionPolicy(target_bytes=1 << 30))
    assert [sum(map(len, run)) for run in runs] == [MAX_RUN_LEDGERS, 10]
