"""The node's batched add path (issue 17) says and stores exactly what one entry at a time would.

Storage.add_runs checks and journals a whole AddRequest, sharing the per-ledger checks and the index update
of a run of entries, and answers in runs (ledger.proto AddRange). Fed the same entries one per call, every
entry takes the full path; both nodes must give the same answer for every entry, in order, and end up with
the same index, LAC and payloads. The service's two response forms say the same thing entry for entry.
"""
from __future__ import annotations

import asyncio
import pathlib
import tempfile
from array import array

from hypothesis import HealthCheck, given, settings, strategies as st

from protos import ledger_pb2 as pb
from storage_node.config import NodeConfig
from storage_node.entry_index import LedgerIndex, pack
from storage_node.service import _gather, _response
from storage_node.storage import AddRun, Storage
from tests.harness.node_client import KEY, OTHER_KEY, make_entry

MAX_ENTRY_BYTES = 64


def _config(data_dir: pathlib.Path) -> NodeConfig:
    return NodeConfig(data_dir=data_dir, port=0, metadata="zk://127.0.0.1:1/unused", node_id="unit",
                      max_entry_bytes=MAX_ENTRY_BYTES)


@st.composite
def entries(draw):
    ledger_id = draw(st.sampled_from([1, 1, 1, 2, 3]))
    entry_id = draw(st.integers(0, 12))
    payload = draw(st.sampled_from([b"", b"p", b"q" * 20, b"x" * MAX_ENTRY_BYTES, b"y" * (MAX_ENTRY_BYTES + 1)]))
    flaw = draw(st.sampled_from([None] * 8 + ["digest", "key", "no key", "flags", "lac", "id"]))
    entry = make_entry(ledger_id, entry_id, payload, key=OTHER_KEY if flaw == "key" else KEY,
                       recovery=draw(st.booleans()) and draw(st.booleans()))
    if flaw == "digest":
        entry.digest ^= 1
    elif flaw == "no key":
        entry.master_key = b""
    elif flaw == "flags":
        entry.flags |= 2
    elif flaw == "lac":
        entry.last_add_confirmed = entry_id
    elif flaw == "id":
        entry.entry_id = -1 - entry_id
    return entry


# A request's entries, mostly runs of consecutive ids as a writer sends them, and what happens before it.
requests = st.lists(st.tuples(
    st.lists(entries(), max_size=6) | st.builds(
        lambda ledger, first, n: [make_entry(ledger, e, b"r%d" % e) for e in range(first, first + n)],
        st.sampled_from([1, 2]), st.integers(0, 10), st.integers(1, 8)),
    st.sampled_from([None] * 6 + ["fence 2", "read-only", "writable"]),
), min_size=1, max_size=6)


def _per_entry(runs: list[AddRun]) -> list[tuple]:
    return [tuple(r) for run in runs for r in run.results()]


async def _feed(storage: Storage, batches, one_at_a_time: bool) -> list[tuple]:
    """Every entry's answer (ledger, entry, status, message), in order."""
    answers = []
    for batch, before in batches:
        if before == "fence 2":
            await storage.fence(2, KEY)
        elif before == "read-only":
            storage.set_read_only("test", "made read-only by the test")
        elif before == "writable":
            storage.set_read_only("test", "")
        for part in ([[e] for e in batch] if one_at_a_time else [batch]):
            runs, group = storage.add_runs(part)
            for run in runs:
                assert run.first_entry_id <= run.last_entry_id
            answers += _per_entry(runs)
            if group is not None:
                assert await group.outcome() is None
    return answers


def _stored(storage: Storage) -> dict:
    stored = {}
    for ledger_id, state in storage.ledgers.items():
        ids = list(state.index.entries_between(0, 100))
        stored[ledger_id] = (state.last_entry_id, state.last_add_confirmed, state.fenced, state.index.count,
                             [(e, bytes(storage.read_entry(ledger_id, e).payload)) for e in ids])
    return stored


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests)
def test_a_batch_is_answered_and_stored_as_its_entries_one_by_one(batches):
    async def scenario(tmp: pathlib.Path):
        together, alone = Storage(_config(tmp / "batched")), Storage(_config(tmp / "alone"))
        await together.open()
        await alone.open()
        try:
            answers = await _feed(together, batches, one_at_a_time=False)
            expected = await _feed(alone, batches, one_at_a_time=True)
            assert answers == expected
            sent = [e for batch, _ in batches for e in batch]
            assert [(ledger_id, entry_id) for ledger_id, entry_id, _, _ in answers] == \
                [(e.ledger_id, e.entry_id) for e in sent]
            # What the node holds follows from the entries it acknowledged, not from either path.
            acked = [e for e, (_, _, status, _) in zip(sent, answers) if status == pb.OK]
            for ledger_id, state in together.ledgers.items():
                mine = [e for e in acked if e.ledger_id == ledger_id]
                assert state.last_entry_id == max((e.entry_id for e in mine), default=-1)
                assert state.last_add_confirmed == max((e.last_add_confirmed for e in mine), default=-1)
                assert list(state.index.entries_between(0, 100)) == sorted({e.entry_id for e in mine})
                for e in mine:      # the last acknowledged copy of an id is the one read back
                    assert bytes(together.read_entry(ledger_id, e.entry_id).payload) == \
                        [m.payload for m in mine if m.entry_id == e.entry_id][-1]
            assert _stored(together) == _stored(alone)
            assert together.journal.records == alone.journal.records
        finally:
            await together.close()
            await alone.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(pathlib.Path(tmp)))


def test_runs_join_consecutive_entries_of_a_ledger_and_split_where_the_answer_or_the_ids_change(tmp_path):
    async def scenario():
        storage = Storage(_config(tmp_path))
        await storage.open()
        batch = [make_entry(1, e, b"x") for e in (0, 1, 2, 4, 5)] + [make_entry(1, 6, b"x", digest=1)] + \
            [make_entry(1, 7, b"x"), make_entry(2, 8, b"y"), make_entry(2, 9, b"y", key=b"")]
        runs, group = storage.add_runs(batch)
        assert [(r.ledger_id, r.first_entry_id, r.last_entry_id, r.status) for r in runs] == [
            (1, 0, 2, pb.OK), (1, 4, 5, pb.OK), (1, 6, 6, pb.BAD_REQUEST), (1, 7, 7, pb.OK), (2, 8, 8, pb.OK),
            (2, 9, 9, pb.BAD_REQUEST)]
        assert "digest mismatch" in runs[2].message and "master key" in runs[5].message
        assert await group.outcome() is None
        storage.set_read_only("test", "full")
        refused, group = storage.add_runs([make_entry(1, e, b"z") for e in range(8, 20)])
        assert group is None and [(r.first_entry_id, r.last_entry_id, r.status) for r in refused] == [
            (8, 19, pb.READ_ONLY)]
        await storage.close()

    asyncio.run(scenario())


runs = st.lists(st.builds(
    lambda ledger, first, n, status: AddRun(ledger, first, first + n - 1, status,
                                            "" if status == pb.OK else f"status {status}"),
    st.sampled_from([-1, 1, 2]), st.integers(0, 20), st.integers(1, 4),
    st.sampled_from([pb.OK, pb.OK, pb.BAD_REQUEST, pb.FENCED])), max_size=6)


@given(st.lists(st.tuples(runs, st.sampled_from([None, "fsync failed"])), max_size=4))
def test_both_response_forms_answer_the_same_entries_in_the_same_order(requests_answers):
    gathered: list[AddRun] = []
    expected = []
    for answers, error in requests_answers:
        _gather(gathered, answers, error)
        for ledger_id, entry_id, status, message in _per_entry(answers):
            if error is not None and status == pb.OK:
                status, message = pb.ERROR, f"not durable, retry: {error}"
            expected.append((ledger_id, entry_id, status, message))
    ranged, per_entry = _response(gathered, True), _response(gathered, False)
    assert not ranged.results and not per_entry.ranges
    assert [(r.ledger_id, r.entry_id, r.status, r.message) for r in per_entry.results] == expected
    assert [(r.ledger_id, e, r.status, r.message) for r in ranged.ranges
            for e in range(r.first_entry_id, r.last_entry_id + 1)] == expected
    assert len(ranged.ranges) <= sum(len(answers) for answers, _ in requests_answers)


@given(st.lists(st.tuples(st.integers(0, 3000), st.integers(1, 40)), max_size=8), st.integers(0, 1 << 20))
def test_putting_a_run_indexes_what_putting_its_entries_one_by_one_does(puts, far):
    together, alone = LedgerIndex(), LedgerIndex()
    for n, (first, count) in enumerate(puts):
        first = first if n % 3 else first + far        # now and then far away: the overflow dict
        locations = [pack(n, 100 * i) for i in range(count)]
        lengths = [10 + i for i in range(count)]
        together.put_run(first, array("q", locations), lengths)
        for i in range(count):
            alone.put(first + i, locations[i], lengths[i])
    assert (together.base, together.count, dict(together.overflow)) == (alone.base, alone.count, dict(alone.overflow))
    assert (together.locations, together.lengths) == (alone.locations, alone.lengths)
