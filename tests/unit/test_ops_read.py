"""Reading: chunks spread over the ensemble, failover to the next replica, digest verification, nodes that failed
recently asked last, speculative calls, chunk sizes."""
from hypothesis import given, strategies as st

from connector.client.errors import DigestMismatchError, NodeError
from connector.client.ops.read import (
    CHUNK_BYTES,
    FIRST_CHUNK_ENTRIES,
    ChunkPlan,
    EntryCall,
    EntryRead,
    ReadWindow,
    Speculation,
    _cover,
    _positions,
    _residues,
    plan_chunks,
)
from connector.client.schedule import Schedule
from metadata.model import Fragment, LedgerMetadata, LedgerState
from protos import ledger_pb2 as pb
from protos import wire
from protos.digest import entry_digest


def response(entry_id, payload=b"p", corrupt=False, status=pb.OK):
    return pb.ReadResponse(status=status, ledger_id=7, entry_id=entry_id, last_add_confirmed=-1, payload=payload,
                           digest=entry_digest(7, entry_id, -1, payload) ^ int(corrupt))


def closed(e, wq, last, fragments=((0, None),), length=0, state=LedgerState.CLOSED):
    frags = tuple(Fragment(first, ens or tuple("abcde"[:e])) for first, ens in fragments)
    return LedgerMetadata(7, e, wq, min(2, wq), frags, state=state, last_entry_id=last, length=length)


def test_full_replication_chunks_rotate_over_all_nodes():
    chunks = plan_chunks(closed(3, 3, 99), 0, 99, 25)
    assert [[c.node for c in chunk.calls] for chunk in chunks] == [["a"], ["b"], ["c"], ["a"]]
    assert [(chunk.first, chunk.last) for chunk in chunks] == [(0, 24), (25, 49), (50, 74), (75, 99)]


def test_striped_chunks_ask_enough_nodes_to_hold_every_entry():
    for chunk in plan_chunks(closed(4, 2, 99), 0, 99, 10):
        nodes = {c.node for c in chunk.calls}
        for e in range(chunk.first, chunk.last + 1):
            assert nodes & set(chunk.write_set(e))


@given(st.integers(1, 6).flatmap(lambda e: st.tuples(st.just(e), st.integers(1, e))), st.integers(0, 10_000),
       st.integers(0, 40), st.integers(0, 12))
def test_a_chunk_asks_the_nodes_a_walk_over_each_of_its_entries_would(quorum, first, length, rotation):
    """The nodes are found from the entry ids modulo E: the same as walking every entry of the chunk."""
    e, wq = quorum
    schedule, ensemble = Schedule(e, wq, 1), tuple("abcdef"[:e])
    uncovered, expected = set(range(first, first + length + 1)), []
    for step in range(e):
        position = (rotation + step) % e
        held = {entry for entry in uncovered if position in schedule.write_set(entry)}
        if held:
            expected.append(ensemble[position])
            uncovered -= held
    positions = _positions(e, rotation, ensemble, ())
    assert _cover(schedule, ensemble, _residues(first, first + length, e), positions) == expected


def test_chunks_split_at_fragment_boundaries():
    meta = closed(3, 3, 20, ((0, ("a", "b", "c")), (8, ("a", "d", "c"))))
    chunks = plan_chunks(meta, 5, 20, 100)
    assert [(c.first, c.last, c.ensemble) for c in chunks] == [(5, 7, ("a", "b", "c")), (8, 20, ("a", "d", "c"))]


def test_chunk_fails_over_what_its_node_did_not_deliver():
    chunk = plan_chunks(closed(3, 3, 3), 0, 3, 4)[0]
    (call,) = chunk.calls
    chunk.on_entry(call.node, response(0))
    chunk.on_entry(call.node, response(1, corrupt=True))
    chunk.on_entry(call.node, response(2, status=pb.ERROR))
    chunk.on_call_done(call)
    assert chunk.calls_done
    failovers = chunk.failovers()
    assert [f.entry_id for f in failovers] == [1, 2, 3]
    assert all(f.next_node() != call.node for f in failovers)


def test_entry_read_tries_each_replica_then_reports():
    read = EntryRead(7, 5, ("a", "b", "c"))
    assert read.next_node() == "a"
    read.on_failure("a", "unavailable")
    assert read.next_node() == "b"
    read.on_response("b", response(5, corrupt=True))
    assert read.next_node() == "c"
    read.on_response("c", response(5, b"ok"))
    assert read.entry.payload == b"ok" and read.next_node() is None


def test_entry_read_exhausted_names_digest_mismatch():
    read = EntryRead(7, 5, ("a",))
    read.next_node()
    read.on_response("a", response(5, corrupt=True))
    assert read.next_node() is None
    assert isinstance(read.error(), DigestMismatchError)
    read = EntryRead(7, 5, ("a",))
    read.on_failure(read.next_node(), "unavailable")
    assert isinstance(read.error(), NodeError) and "could not be read from any replica" in str(read.error())


def test_a_status_this_client_does_not_know_fails_the_entry_on_that_node_not_the_read():
    """A newer node's status (or a damaged message's: the client's own decoder reads a status as int64) is a
    failure of that node for the entry, named by number, and the read fails over; pb.Status.Name raised
    ValueError out of the read."""
    chunk = plan_chunks(closed(3, 3, 1), 0, 1, 4)[0]
    (call,) = chunk.calls
    chunk.on_entry(call.node, response(0, status=99))
    decoded = wire.ReadResponseView()   # as protos.wire decodes a big entry; protobuf cannot hold this status
    decoded.entry_id, decoded.status = 1, (1 << 32) + pb.OK
    chunk.on_entry(call.node, decoded)
    chunk.on_call_done(call)
    assert [(r.entry_id, r.failures) for r in chunk.failovers()] == [(0, {"a": "status 99"}),
                                                                     (1, {"a": f"status {(1 << 32) + pb.OK}"})]


def test_single_entry_reads_start_at_the_node_of_their_entry():
    """A binary search's single-entry reads spread over the ensemble; they all asked the first node before, so
    one paused node held every one of them for the whole timeout (audit 2026-11-29, finding 2a)."""
    meta = closed(3, 3, 999)
    assert [plan_chunks(meta, e, e, 1)[0].calls[0].node for e in (500, 250, 125, 62, 31, 15)] == \
        ["c", "b", "c", "c", "b", "a"]


def test_a_read_of_many_chunks_still_starts_each_at_the_next_node():
    meta = closed(3, 3, 99)
    assert [chunk.calls[0].node for chunk in plan_chunks(meta, 10, 99, 3)][:6] == ["b", "c", "a", "b", "c", "a"]


def test_nodes_that_failed_recently_are_asked_last():
    chunk = plan_chunks(closed(3, 3, 99), 0, 9, 10)[0]
    assert [c.node for c in chunk.start(try_last={"a"})] == ["b"]
    assert [c.node for c in chunk.start(try_last={"a", "b"})] == ["c"]
    assert [c.node for c in chunk.start(try_last={"a", "b", "c"})] == ["a"]   # all failed: the usual order


@given(st.integers(2, 5).flatmap(lambda e: st.tuples(st.just(e), st.integers(1, e - 1))), st.integers(0, 100),
       st.integers(0, 20), st.sets(st.sampled_from("abcde")))
def test_a_striped_chunk_avoids_recently_failed_nodes_where_others_hold_the_entries(quorum, first, length, failed):
    e, wq = quorum
    chunk = plan_chunks(closed(e, wq, first + length), first, first + length, length + 1)[0]
    asked = {c.node for c in chunk.start(try_last=failed)}
    for entry in range(first, first + length + 1):
        holders = set(chunk.write_set(entry))
        assert asked & holders
        if holders - failed:
            assert asked & (holders - failed)


def test_a_speculative_call_asks_the_next_replica_for_what_the_slow_node_did_not_deliver():
    chunk = plan_chunks(closed(3, 3, 9), 0, 9, 10)[0]
    (call,) = chunk.calls
    for e in range(4):
        chunk.on_entry(call.node, response(e))
    (second,) = chunk.speculate(call.node)
    assert (second.node, second.first_entry_id, second.last_entry_id) == ("b", 4, 9)
    (third,) = chunk.speculate(second.node)
    assert third.node == "c"
    assert chunk.speculate(third.node) == []   # no replica left that was not asked
    for e in range(4, 10):
        chunk.on_entry(third.node, response(e))
        chunk.on_entry(second.node, response(e, b"late"))   # the first valid copy counts
    assert chunk.complete and [e.payload for e in chunk.in_order()] == [b"p"] * 10


def test_a_speculative_call_never_takes_a_damaged_copy():
    chunk = plan_chunks(closed(3, 3, 1), 0, 1, 2)[0]
    (call,) = chunk.calls
    (spare,) = chunk.speculate(call.node)
    chunk.on_entry(spare.node, response(0, corrupt=True))
    chunk.on_entry(spare.node, response(1))
    chunk.on_call_done(spare)
    assert not chunk.complete
    chunk.on_entry(call.node, response(0))
    assert chunk.complete


def test_a_striped_speculative_call_covers_only_what_the_slow_node_held_and_was_not_delivered():
    chunk = plan_chunks(closed(4, 2, 15), 0, 15, 16)[0]
    slow = chunk.calls[0].node
    wanted = [e for e in range(16) if slow in chunk.write_set(e)]
    others = {c.node for c in chunk.calls} - {slow}
    spares = chunk.speculate(slow)
    assert spares and not {c.node for c in spares} & ({slow} | others)   # only nodes the chunk had not asked
    for e in wanted:   # another node asked, before or now, holds each entry the slow one was to deliver
        assert (others | {c.node for c in spares}) & (set(chunk.write_set(e)) - {slow})
    assert min(c.first_entry_id for c in spares) == wanted[0] and max(c.last_entry_id for c in spares) == wanted[-1]


def test_a_call_is_overdue_once_after_the_speculative_timeout_without_progress():
    speculation = Speculation(0.5)
    speculation.on_start("slow", 10.0)
    speculation.on_start("streaming", 10.0)
    speculation.on_start("done", 10.125)
    speculation.on_progress("streaming", 10.25)   # an answer came: its wait starts again
    speculation.on_end("done")
    assert speculation.due == 10.5 and speculation.overdue(10.4) == []
    assert speculation.overdue(10.5) == ["slow"] and speculation.due == 10.75
    speculation.on_progress("slow", 10.875)   # late answers of an overdue call do not make it overdue again
    assert speculation.overdue(11.5) == ["streaming"] and speculation.due is None and speculation.overdue(99) == []


def test_a_speculative_timeout_of_zero_never_speculates():
    speculation = Speculation(0)
    speculation.on_start("slow", 10.0)
    assert speculation.due is None and speculation.overdue(1e9) == []


def test_an_entry_read_asks_the_next_replica_after_a_failure_and_beside_a_slow_one():
    read = EntryRead(7, 5, ("a", "b", "c"))
    assert read.calls() == [EntryCall("a", 5)]
    assert read.speculate("a") == [EntryCall("b", 5)]   # a keeps the read waiting: b is asked as well
    read.on_failure("b", "unavailable")
    assert read.calls() == [EntryCall("c", 5)] and not read.complete
    read.on_response("a", response(5, b"from a"))
    assert read.complete and read.calls() == [] and read.speculate("c") == []


def test_an_entry_read_asks_recently_failed_replicas_last_and_takes_the_first_valid_answer():
    read = EntryRead(7, 5, ("a", "b", "c"), try_last={"a"})
    assert read.next_node() == "b" and read.next_node() == "c" and read.untried
    read.on_response("c", response(5, b"from c"))
    read.on_response("b", response(5, b"from b"))
    assert read.entry.payload == b"from c" and not read.untried and read.next_node() is None


def test_chunks_are_cut_one_at_a_time_with_the_size_asked_for_each():
    plan = ChunkPlan(closed(3, 3, 20, ((0, ("a", "b", "c")), (8, ("a", "d", "c")))), 2, 20)
    cut = [(c.first, c.last) for c in iter(lambda: plan.next(4), None)]
    assert cut == [(2, 5), (6, 7), (8, 11), (12, 15), (16, 19), (20, 20)]


def test_a_ledger_of_known_length_is_read_in_chunks_of_its_average_entry_size():
    window = ReadWindow(closed(3, 3, 999, length=1000 * 256 * 1024))
    assert window.chunk_entries == CHUNK_BYTES // (256 * 1024) and window.chunks_in_flight == 6
    window.on_chunk_read(16, 16 * 1024)   # the metadata's length rules
    assert window.chunk_entries == CHUNK_BYTES // (256 * 1024)
    assert ReadWindow(closed(3, 3, 99_999, length=100 * 100_000)).chunk_entries == 1024


def test_a_ledger_of_unknown_length_is_read_in_chunks_sized_from_the_entries_received():
    """A ledger closed by recovery (length -1) or OPEN (0): one small chunk first, then chunks of about CHUNK_BYTES
    from the sizes received. Before, 4 KiB entries were assumed: 1024-entry chunks of 256 KiB entries, 256 MiB
    each, six at once (audit 2026-11-29, finding 1: 921 MiB RSS for what a writer-closed ledger read in 137 MiB)."""
    for meta in (closed(3, 3, 2999, length=-1), closed(3, 3, -1, state=LedgerState.OPEN)):
        window = ReadWindow(meta)
        assert (window.chunk_entries, window.chunks_in_flight) == (FIRST_CHUNK_ENTRIES, 1)
        window.on_chunk_read(FIRST_CHUNK_ENTRIES, FIRST_CHUNK_ENTRIES * 256 * 1024)
        assert window.chunk_entries * 256 * 1024 <= CHUNK_BYTES and window.chunks_in_flight == 6
        window.on_chunk_read(16, 16 * 100)   # smaller entries later: chunks grow, never past 1024 entries
        assert CHUNK_BYTES // (256 * 1024) < window.chunk_entries <= 1024
        window.on_chunk_read(16, 16 * 1024 * 1024)   # larger ones: the next chunks shrink at once
        assert window.chunk_entries * 1024 * 1024 <= CHUNK_BYTES
