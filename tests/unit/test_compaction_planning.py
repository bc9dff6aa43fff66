"""Which ledgers a compaction rewrites and into how many (connector.compaction.runs_of): pure, no I/O."""
from connector.compaction import MAX_RUN_LEDGERS, PENDING, Candidate, CompactionPolicy, plan_start, runs_of
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


def looked_at(*kinds: str) -> tuple[list[StreamLedger], list]:
    """Ledgers at offsets 10, 20, ... and what a plan found of each: 'c' a small candidate, 'b' a large ledger (stays
    for good), 'p' pending (OPEN, or a commit still holds it)."""
    ledgers = [StreamLedger(100 + n, 10 * (n + 1), 10 * (n + 1) + 9) for n in range(len(kinds))]
    found = [Candidate(ledger, 10, QUORUM) if kind == "c" else None if kind == "b" else PENDING
             for ledger, kind in zip(ledgers, kinds)]
    return ledgers, found


def test_the_next_plan_starts_where_something_before_can_still_change():
    """Rule 15: a compaction plan looked at every ledger of the stream (a metadata read each), every run, whatever
    the stream's age. The next plan now starts past what can no longer join a run."""
    policy = CompactionPolicy(target_bytes=100)
    end = 1000   # the stream's last ledger, which a plan never takes

    def start(*kinds):
        ledgers, found = looked_at(*kinds)
        return plan_start(ledgers, found, runs_of([f if isinstance(f, Candidate) else None for f in found], policy),
                          end)

    assert start("b", "b", "b") == end                 # nothing can change: the next plan looks at new ledgers only
    assert start("b", "c", "b", "b") == end            # a lone small ledger between large ones stays as it is
    assert start("b", "b", "c", "c") == 30             # small ones at the end: the next ledgers may join them
    assert start("b", "c", "c", "b", "b") == 20        # a run rewritten now: its new ledgers may still be small
    assert start("b", "p", "b", "c", "c", "b") == 20   # a pending ledger may become a candidate
    assert start("b", "c", "p", "b") == 20             # ... and join the small ones just before it (review 2)
    assert start() == end
