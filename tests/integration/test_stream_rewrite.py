"""A compaction's swap in the paged stream metadata (streams.replace_run, issue 14 item 4) against a real ZooKeeper:
a run of ledgers in the tail, in the pages, or from the pages into the tail is replaced in one multi with the same
offsets; readers holding the head from before the swap still read the stream as it was (the replaced pages stay
until the grace), readers of the new head read the rewritten pages; a run that changed is refused.

Histories are built through the metadata API with made-up ledger ids: no ledger is written.
"""
import pytest

from metadata import layout, streams
from metadata.errors import MetadataConflictError, OffsetsGoneError
from metadata.model import StreamLedger, StreamRecord
from metadata.streams import PAGE_LEDGERS, RunChangedError, replace_run
from tests.integration.test_stream_pages import FIRST_ID, appended

NEW_ID = 2_000_000_000   # the compaction's ledgers are created after the run's


@pytest.fixture
def history(store):
    """A raw stream of 1,000 closed ledgers (3 pages and a tail), committed 100 at a time."""
    streams.create_stream(store, StreamRecord("events", "raw"))
    for start in range(0, 1000, 100):
        ids = range(FIRST_ID + start, FIRST_ID + start + 100)
        streams.update_stream(store, "events", lambda r: appended(r, ids))
    head = streams.read_stream(store, "events").value
    assert len(streams.list_pages(store, "events")) == 3 and len(head.tail) == 1000 - 3 * PAGE_LEDGERS
    return head


def merged(run: list[StreamLedger], ledger_id: int) -> tuple[StreamLedger, ...]:
    return (StreamLedger(ledger_id, run[0].first_offset, run[-1].last_offset),)


def swap(store, run, by) -> StreamRecord:
    return streams.update_stream(store, "events", lambda head: replace_run(store, head, tuple(run), by)).value


def expected(ledgers, run, by) -> list[StreamLedger]:
    at = ledgers.index(run[0])
    return ledgers[:at] + list(by) + ledgers[at + len(run):]


@pytest.mark.parametrize("where", [slice(800, 900), slice(10, 600), slice(600, 850)],
                         ids=["in-the-tail", "across-pages", "pages-into-tail"])
def test_a_run_is_replaced_in_one_swap_and_older_heads_still_read_the_stream_as_it_was(store, history, where):
    before = list(streams.iter_ledgers(store, history))
    run = before[where]
    by = merged(run, NEW_ID)

    after = swap(store, run, by)

    now = list(streams.iter_ledgers(store, after))
    assert now == expected(before, run, by)
    assert list(streams.iter_ledgers(store, history)) == before   # a reader that planned before the swap
    assert after.next_offset == history.next_offset and after.last_ledger == history.last_ledger
    lo, hi = run[5].first_offset, run[-1].last_offset + 3       # a range read inside the run gets its new ledger
    assert list(streams.iter_ledgers(store, after, lo, hi))[0] == by[0]
    assert streams.held_ledgers(store, after, [NEW_ID, run[1].ledger_id, before[-1].ledger_id]) == {
        NEW_ID, before[-1].ledger_id}
    assert streams.held_ledgers(store, history, [NEW_ID, run[1].ledger_id]) == {run[1].ledger_id}


def test_the_replaced_pages_are_what_older_heads_read_and_nothing_else(store, history):
    before = list(streams.iter_ledgers(store, history))
    rewrite = replace_run(store, history, tuple(before[300:400]), merged(before[300:400], NEW_ID))
    after = swap(store, before[300:400], merged(before[300:400], NEW_ID))

    assert after.page_generation == 1 and [p.generation for p, _ in rewrite.pages] == [1]
    assert rewrite.replaced == tuple(streams.live_pages(store, history)[1:2])
    for page in rewrite.replaced:   # the compaction deletes them after its grace
        store.delete(layout.stream_page_path("events", page))
    run = before[300:400]
    assert list(streams.iter_ledgers(store, after)) == expected(before, run, merged(run, NEW_ID))
    with pytest.raises(OffsetsGoneError):
        list(streams.iter_ledgers(store, history))


def test_compactions_stack_and_the_stream_keeps_sealing_pages(store, history):
    before = list(streams.iter_ledgers(store, history))
    first = swap(store, before[0:700], merged(before[0:700], NEW_ID))
    once = list(streams.iter_ledgers(store, first))
    second = swap(store, once[0:200], merged(once[0:200], NEW_ID + 1))   # the new ledger and the 199 after it
    twice = list(streams.iter_ledgers(store, second))
    assert twice == expected(once, once[0:200], merged(once[0:200], NEW_ID + 1))
    assert list(streams.iter_ledgers(store, first)) == once and list(streams.iter_ledgers(store, history)) == before

    ids = range(FIRST_ID + 1000, FIRST_ID + 1300)
    grown = streams.update_stream(store, "events", lambda r: appended(r, ids)).value
    everything = list(streams.iter_ledgers(store, grown))
    assert everything[:len(twice)] == twice and [s.ledger_id for s in everything[len(twice):]] == list(ids)
    offsets = [(s.first_offset, s.last_offset) for s in streams.iter_ledgers(store, grown)]
    assert all(b[0] == a[1] + 1 for a, b in zip(offsets, offsets[1:])) and offsets[0][0] == 0


def test_a_run_that_changed_is_refused(store, history):
    before = list(streams.iter_ledgers(store, history))
    stranger = StreamLedger(7, before[10].first_offset, before[10].last_offset)
    with pytest.raises(RunChangedError):   # not as the stream holds it
        swap(store, [stranger] + before[11:20], merged(before[10:20], NEW_ID))
    with pytest.raises(RunChangedError):   # the stream's last ledger stays
        swap(store, before[-5:], merged(before[-5:], NEW_ID))
    truncated = streams.update_stream(store, "events", lambda r: r.replace(first_offset=before[15].first_offset)).value
    with pytest.raises(RunChangedError):   # truncated meanwhile
        swap(store, before[10:20], merged(before[10:20], NEW_ID))
    assert list(streams.iter_ledgers(store, truncated)) == before[15:]
    with pytest.raises(ValueError):        # a replacement must hold exactly the run's offsets
        replace_run(store, truncated, tuple(before[20:30]), merged(before[20:29], NEW_ID))


def test_the_swap_lands_only_with_its_record_in_the_same_multi(store, history):
    before = list(streams.iter_ledgers(store, history))
    store.create("/compactions/c1", b"running")
    store.set_data("/compactions/c1", b"abandoned")   # version 1: someone else decided
    calls = []

    def transform(head):
        calls.append(head)
        if len(calls) > 3:
            raise RunChangedError("gave up")
        rewrite = replace_run(store, head, tuple(before[:300]), merged(before[:300], NEW_ID))
        return streams.Rewrite(rewrite.head, rewrite.pages, rewrite.replaced, (("/compactions/c1", b"swapped", 0),))

    with pytest.raises(RunChangedError):
        streams.update_stream(store, "events", transform)
    assert len(calls) == 4 and list(streams.iter_ledgers(store, streams.read_stream(store, "events").value)) == before
    assert streams.list_pages(store, "events") == streams.live_pages(store, history)   # nothing was created

    store.create("/compactions/c2", b"running")
    rewrite = replace_run(store, history, tuple(before[:300]), merged(before[:300], NEW_ID))
    with pytest.raises(MetadataConflictError):   # a head read before the stream changed cannot land
        streams.write_stream(store, streams.Rewrite(rewrite.head, rewrite.pages, rewrite.replaced,
                                                    (("/compactions/c2", b"swapped", 0),)), 0)
    assert store.read("/compactions/c2", bytes).value == b"running"

    def landing(head):
        rewrite = replace_run(store, head, tuple(before[:300]), merged(before[:300], NEW_ID))
        return streams.Rewrite(rewrite.head, rewrite.pages, rewrite.replaced, (("/compactions/c2", b"swapped", 0),))

    after = streams.update_stream(store, "events", landing).value
    assert store.read("/compactions/c2", bytes).value == b"swapped"
    assert list(streams.iter_ledgers(store, after)) == expected(before, before[:300], merged(before[:300], NEW_ID))
