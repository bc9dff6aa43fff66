"""Truncation and retention (connector/retention.py, issue 14 item 3) against a real ZooKeeper: whole ledgers leave
the stream's front in one CAS and are deleted after it, first_offset lands on a ledger boundary and never passes
the stream's end, an OPEN tail is never cut, retention by age and by size removes exactly the whole ledgers past
the limit at a cost of what it removes and what was added since, and a run that dies after its CAS is finished by
the next one.

Ledgers are metadata only (closed, with a length): a cut never reads a ledger's entries. The runs killed between
the CAS and the deletions write real ledgers on real nodes, and the stream is read back from its first offset.
"""
import subprocess
import sys
import time

import pytest

from connector.client import LedgerClient, Streams
from connector.soak.proxy import TcpProxy
from connector.retention import (
    CHUNK_LEDGERS, COUNT_LEDGERS, CUT, PLANNED, TAIL_DELETED, TruncateOpenLedgerError, apply_all, apply_retention,
    clean_cuts, pending_cuts, set_retention, truncate_stream,
)
from metadata import layout, registry, streams
from metadata.errors import MetadataError
from metadata.model import ByteCount, Retention, StreamLedger, StreamRecord
from metadata.store import MetadataStore
from tests.harness.poll import poll_until
from tests.harness.stream_fixtures import OFFSETS, appended, closed_ledgers, delete_head

def ledger_ids(store: MetadataStore, name: str) -> list[int]:
    return [s.ledger_id for s in streams.iter_ledgers(store, streams.read_stream(store, name).value)]


def written_at(store: MetadataStore, ledger_id: int) -> float:
    """The ledger's last metadata write by ZooKeeper's clock: what retention by age measures."""
    return store.modified_at(layout.ledger_path(ledger_id))


def exists(store: MetadataStore, ledger_id: int) -> bool:
    return store.exists(layout.ledger_path(ledger_id))


@pytest.fixture
def lc(metadata_uri):
    with LedgerClient(metadata_uri) as client:
        yield client


def test_truncation_moves_first_offset_to_a_ledger_boundary_and_deletes_the_ledgers_below(lc):
    store = lc.store
    ids = closed_ledgers(store, 600)
    appended(store, "events", ids)
    assert len(streams.list_pages(store, "events")) == 2   # ledgers 0..255 and 256..511 paged, 512..599 the tail

    result = truncate_stream(lc, "events", 260 * OFFSETS + 5)   # inside ledger 260, in the second page
    head = streams.read_stream(store, "events").value
    assert (result.from_offset, result.first_offset, result.ledgers) == (0, 260 * OFFSETS, 260)
    assert head.first_offset == 260 * OFFSETS
    assert ledger_ids(store, "events") == ids[260:]
    assert not any(exists(store, i) for i in ids[:260]) and all(exists(store, i) for i in ids[260:])
    assert [p.first_offset for p in streams.list_pages(store, "events")] == [256 * OFFSETS]   # straddles: kept
    assert pending_cuts(store, "events") == []

    result = truncate_stream(lc, "events", 590 * OFFSETS)   # exactly where ledger 590 starts, in the tail
    assert result.first_offset == 590 * OFFSETS and result.ledgers == 330
    assert ledger_ids(store, "events") == ids[590:] and streams.list_pages(store, "events") == []
    assert not any(exists(store, i) for i in ids[:590])

    result = truncate_stream(lc, "events", 10 ** 9)   # past the end: the whole stream, up to its next offset
    head = streams.read_stream(store, "events").value
    assert result.first_offset == head.first_offset == head.next_offset == 600 * OFFSETS and head.tail == ()
    assert not any(exists(store, i) for i in ids)
    more = closed_ledgers(store, 1)
    assert appended(store, "events", more).tail == (StreamLedger(more[0], 6000, 6009),)   # offsets only grow


def test_a_point_at_or_below_the_first_offset_or_inside_the_first_ledger_changes_nothing(lc):
    ids = closed_ledgers(lc.store, 3)
    appended(lc.store, "events", ids)
    truncate_stream(lc, "events", OFFSETS)
    version = lc.store.read(layout.stream_path("events"), len).version
    for point in (0, 5, OFFSETS, OFFSETS + 9):
        result = truncate_stream(lc, "events", point)
        assert not result.cut and result.first_offset == OFFSETS
    assert lc.store.read(layout.stream_path("events"), len).version == version
    assert ledger_ids(lc.store, "events") == ids[1:] and pending_cuts(lc.store, "events") == []


def test_an_empty_ledger_at_the_cut_leaves_with_the_ledgers_below(lc):
    store = lc.store
    full, empty, after = closed_ledgers(store, 3)
    streams.create_stream(store, StreamRecord("events", "raw", tail=(
        StreamLedger(full, 0, 9), StreamLedger(empty, 10, 9), StreamLedger(after, 10, 19))))
    truncate_stream(lc, "events", 10)
    head = streams.read_stream(store, "events").value
    assert head.first_offset == 10 and head.tail == (StreamLedger(after, 10, 19),)
    assert not exists(store, full) and not exists(store, empty)


def test_truncating_into_an_open_last_ledger_is_refused(lc):
    closed, open_ledger = closed_ledgers(lc.store, 2)
    streams.create_stream(lc.store, StreamRecord("events", "raw", owner="writer-7", tail=(
        StreamLedger(closed, 0, 49), StreamLedger(open_ledger, 50))))
    with pytest.raises(TruncateOpenLedgerError, match=r"ledger \d+, which is OPEN \(its owner writer-7 writes it\)"
                                                      r".*truncate --before 50 or less"):
        truncate_stream(lc, "events", 51)
    assert pending_cuts(lc.store, "events") == []
    assert truncate_stream(lc, "events", 50).first_offset == 50
    assert streams.read_stream(lc.store, "events").value.tail == (StreamLedger(open_ledger, 50),)


def test_retention_by_size_keeps_the_newest_ledgers_that_fit_and_counts_only_what_changed(lc, monkeypatch):
    store = lc.store
    ids = closed_ledgers(store, 300, length=100)
    appended(store, "events", ids)
    set_retention(store, "events", max_bytes=20_050)   # 200 ledgers fit, 201 do not

    result = apply_retention(lc, "events")
    head = streams.read_stream(store, "events").value
    assert result.first_offset == head.first_offset == 100 * OFFSETS and ledger_ids(store, "events") == ids[100:]
    assert head.byte_count == ByteCount(1000, 3000, 20_000)
    assert not any(exists(store, i) for i in ids[:100]) and all(exists(store, i) for i in ids[100:])

    added = closed_ledgers(store, 5, length=100)
    appended(store, "events", added)
    reads = []
    read_ledger = MetadataStore.read_ledger
    monkeypatch.setattr(MetadataStore, "read_ledger", lambda self, i: reads.append(i) or read_ledger(self, i))
    apply_retention(lc, "events")
    assert ledger_ids(store, "events") == ids[105:] + added
    assert streams.read_stream(store, "events").value.byte_count == ByteCount(1050, 3050, 20_000)
    # Lengths read: the 5 added ledgers and the front ones, a read-ahead of CHUNK_LEDGERS from the first; not the
    # 200 counted before.
    assert set(added) | set(ids[100:105]) <= set(reads) <= set(added) | set(ids[100:100 + CHUNK_LEDGERS])


def test_size_retention_that_cuts_nothing_stores_its_count_and_reads_only_the_ledgers_added_since(lc, monkeypatch):
    """Day-300 audit 2026-11-29 (rule 15): a run that cut nothing dropped the count it had made, so a stream under its
    retentionBytes (its normal state for weeks) had every ledger's length read again on every pass of the retention
    loop. The first count is now stored at once, later ones once COUNT_LEDGERS ledgers were counted since the stored
    one, and a run under the limit reads none of the front's ledgers either."""
    store = lc.store
    ids = closed_ledgers(store, 600, length=100)
    appended(store, "events", ids)
    set_retention(store, "events", max_bytes=1 << 40)
    reads = []
    read_ledger = MetadataStore.read_ledger
    monkeypatch.setattr(MetadataStore, "read_ledger", lambda self, i: reads.append(i) or read_ledger(self, i))
    assert not apply_retention(lc, "events").cut
    assert sorted(reads) == ids                                          # the first run counts the stream, once
    assert streams.read_stream(store, "events").value.byte_count == ByteCount(0, 6000, 60_000)

    since: list[int] = []
    for more in (1, 2, COUNT_LEDGERS - 3):
        since += appended_ledgers(store, "events", more)
        reads.clear()
        assert not apply_retention(lc, "events").cut
        assert sorted(reads) == since                 # those counted since the stored count, none of the 600 before
    head = streams.read_stream(store, "events").value
    assert head.byte_count == ByteCount(0, head.next_offset, (600 + COUNT_LEDGERS) * 100)   # stored: 64 since
    last = appended_ledgers(store, "events", 1)
    reads.clear()
    assert not apply_retention(lc, "events").cut
    assert reads == last


def appended_ledgers(store: MetadataStore, name: str, count: int) -> list[int]:
    ids = closed_ledgers(store, count, length=100)
    appended(store, name, ids)
    return ids


def test_retention_by_size_never_removes_the_last_ledger(lc):
    ids = closed_ledgers(lc.store, 3, length=500)
    appended(lc.store, "events", ids)
    set_retention(lc.store, "events", max_bytes=100)
    apply_retention(lc, "events")
    assert ledger_ids(lc.store, "events") == ids[2:]


def test_retention_by_age_removes_the_ledgers_last_written_before_the_limit(lc):
    old = closed_ledgers(lc.store, 4)
    appended(lc.store, "events", old)
    last_old = max(written_at(lc.store, i) for i in old)
    # ZooKeeper's mtime has millisecond resolution and the server's clock is this host's: the young ledgers
    # are written once the clock has moved past the old ones' last write.
    poll_until(lambda: time.time() > last_old + 0.005, timeout=5, what="the clock to pass the old ledgers")
    young = closed_ledgers(lc.store, 3)
    appended(lc.store, "events", young)
    first_young = min(written_at(lc.store, i) for i in young)
    assert first_young > last_old
    boundary = (last_old + first_young) / 2
    set_retention(lc.store, "events", max_age=3600)

    assert not apply_retention(lc, "events").cut   # nothing is an hour old
    result = apply_retention(lc, "events", now=boundary + 3600)
    assert result.first_offset == 4 * OFFSETS and ledger_ids(lc.store, "events") == young
    assert not any(exists(lc.store, i) for i in old)
    result = apply_retention(lc, "events", now=time.time() + 3600)   # all of it, up to the next offset
    head = streams.read_stream(lc.store, "events").value
    assert result.first_offset == head.next_offset == 7 * OFFSETS and head.tail == ()


def test_retention_stops_at_an_open_last_ledger(lc):
    closed = closed_ledgers(lc.store, 3)
    streams.create_stream(lc.store, StreamRecord("events", "raw", tail=(
        StreamLedger(closed[0], 0, 9), StreamLedger(closed[1], 10, 19), StreamLedger(closed[2], 20))))
    set_retention(lc.store, "events", max_age=1)
    apply_retention(lc, "events", now=time.time() + 10)
    assert streams.read_stream(lc.store, "events").value.tail == (StreamLedger(closed[2], 20),)


def test_retention_settings_live_in_the_head_and_apply_all_applies_them(lc):
    for name in ("kept", "aged", "sized"):
        appended(lc.store, name, closed_ledgers(lc.store, 3, length=100))
    set_retention(lc.store, "aged", max_age=60)
    set_retention(lc.store, "sized", max_bytes=250)
    assert streams.read_stream(lc.store, "aged").value.retention == Retention(max_age=60)
    set_retention(lc.store, "aged", max_bytes=10 ** 9)
    assert streams.read_stream(lc.store, "aged").value.retention == Retention(60, 10 ** 9)
    results = apply_all(lc)
    assert {r.stream: r.first_offset for r in results} == {"aged": 0, "sized": 10}
    set_retention(lc.store, "aged", max_age=-1, max_bytes=-1)
    assert not streams.read_stream(lc.store, "aged").value.retention.is_set


def test_a_compaction_of_counted_offsets_drops_the_byte_count(lc):
    ids = closed_ledgers(lc.store, 4)
    record = appended(lc.store, "events", ids).replace(byte_count=ByteCount(0, 40, 400))
    rewrite = streams.replace_run(lc.store, record, record.tail[:2], (StreamLedger(999, 0, 19),))
    assert rewrite.head.byte_count is None


# -- a run that dies between its CAS and its deletions --------------------------------------------------


def write_raw_stream(uri: str, name: str, ledgers: int, entries: int) -> None:
    with LedgerClient(uri) as client, Streams(client).open_writer(name, max_ledger_entries=entries) as writer:
        for i in range(ledgers * entries):
            writer.append(f"e{i:04d}".encode())


def killed_at(uri: str, name: str, before: int, step: str) -> None:
    """A truncation in its own process, SIGKILLed once it printed `step`."""
    process = subprocess.Popen([sys.executable, "-m", "tests.harness.truncate_process", uri, name, str(before), step],
                               stdout=subprocess.PIPE, text=True)
    try:
        for line in process.stdout:
            if line.strip() == f"stopped {step}":
                break
        else:
            raise AssertionError(f"the truncation ended before step {step} (exit {process.wait()})")
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("step", [PLANNED, CUT, TAIL_DELETED])
def test_a_truncation_killed_mid_way_leaves_the_stream_whole_and_the_next_run_finishes_it(
        metadata_uri, cluster, step):
    cluster(3)
    write_raw_stream(metadata_uri, "events", ledgers=4, entries=5)   # offsets 0..19 in 4 ledgers
    with LedgerClient(metadata_uri) as lc:
        before = [s.ledger_id for s in streams.iter_ledgers(lc.store, streams.read_stream(lc.store, "events").value)]
    killed_at(metadata_uri, "events", 12, step)
    with LedgerClient(metadata_uri) as lc:
        head = streams.read_stream(lc.store, "events").value
        expected_first = 0 if step == PLANNED else 10
        assert head.first_offset == expected_first
        entries = list(Streams(lc).read("events", start=head.first_offset))
        assert [e.payload for e in entries] == [f"e{i:04d}".encode() for i in range(expected_first, 20)]
        assert [c.state for c in pending_cuts(lc.store, "events")] == [PLANNED if step == PLANNED else CUT]
        assert [i for i in before if not exists(lc.store, i)] == (before[:2] if step == TAIL_DELETED else [])

        # The next run (here a retention run, which cuts nothing: the stream has no retention) finishes the
        # cut, or drops the planned record that never cut once the killed process's session has ended.
        poll_until(lambda: apply_retention(lc, "events") and not pending_cuts(lc.store, "events"), 60,
                   what="the killed run's record handled by the next run")
        deleted = [i for i in before if not exists(lc.store, i)]
        assert deleted == ([] if step == PLANNED else before[:2])
        assert streams.read_stream(lc.store, "events").value.first_offset == expected_first
        assert [e.payload for e in Streams(lc).read("events", start=0)] == [
            f"e{i:04d}".encode() for i in range(expected_first, 20)]


class Crash(Exception):
    """Stands for the process dying at a step (nothing runs after it: truncate_stream has no cleanup)."""


def test_paged_ledgers_left_by_a_run_that_died_are_deleted_by_the_next_run(lc):
    store = lc.store
    ids = closed_ledgers(store, 600)
    appended(store, "events", ids)

    def crash(step, cut):
        if step == TAIL_DELETED:
            raise Crash(step)

    with pytest.raises(Crash):
        truncate_stream(lc, "events", 590 * OFFSETS, on_step=crash)
    assert ledger_ids(store, "events") == ids[590:]   # the stream starts where the cut put it
    assert len(streams.list_pages(store, "events")) == 2 and all(exists(store, i) for i in ids[:512])
    assert [cut.state for cut in pending_cuts(store, "events")] == [CUT]

    result = truncate_stream(lc, "events", 595 * OFFSETS)   # the next run: a truncation that cuts too
    assert result.finished_cuts == 1 and result.first_offset == 595 * OFFSETS
    assert streams.list_pages(store, "events") == [] and pending_cuts(store, "events") == []
    assert not any(exists(store, i) for i in ids[:595]) and all(exists(store, i) for i in ids[595:])


def test_a_paged_ledger_that_could_not_be_deleted_keeps_the_cut_record_for_the_next_run(lc, monkeypatch):
    """Day-300 audit 2026-11-29: a cut deleted its record even when the deletion of a paged ledger below it had failed,
    and that ledger then waited for a later cut of the same stream, which may never come. The record now stays, and
    the stream's next truncation or retention run, or a Spark job's start on it (clean_cuts), deletes the ledger."""
    from connector import retention

    store = lc.store
    ids = closed_ledgers(store, 600)
    appended(store, "events", ids)
    discard = retention.discard

    def failing(client, ledger_id, password):
        if ledger_id == ids[10]:
            raise MetadataError("ZooKeeper connection lost")
        discard(client, ledger_id, password)

    monkeypatch.setattr(retention, "discard", failing)
    assert truncate_stream(lc, "events", 300 * OFFSETS).first_offset == 300 * OFFSETS
    assert exists(store, ids[10]) and [c.state for c in pending_cuts(store, "events")] == [CUT]
    assert not any(exists(store, i) for i in ids[:10] + ids[11:300])

    monkeypatch.setattr(retention, "discard", discard)
    assert clean_cuts(lc, "events") == 1
    assert not exists(store, ids[10]) and pending_cuts(store, "events") == []
    assert [p.first_offset for p in streams.list_pages(store, "events")] == [256 * OFFSETS]   # straddles: kept
    assert ledger_ids(store, "events") == ids[300:]


def test_a_cut_that_comes_late_leaves_the_pages_of_a_stream_created_again_under_the_name_alone(lc):
    """Helper audit 2026-11-29: a cut finds the pages to delete by the stream's name. One whose process stalled
    after its CAS, while the stream was deleted and created again with more than a page of ledgers, deleted the new
    stream's paged ledgers below its offset. It now deletes pages only while its cut's record (which goes with the
    stream) is there; an overwrite's deletes only while the head was created when the replaced head was."""
    store = lc.store
    appended(store, "events", closed_ledgers(store, 600))
    new: list[int] = []

    def recreated(step, cut):
        if step == TAIL_DELETED:   # the cut's process stalls here; the stream is deleted and created again
            delete_head(store, "events")
            new.extend(closed_ledgers(store, 300))
            appended(store, "events", new)

    truncate_stream(lc, "events", 590 * OFFSETS, on_step=recreated)
    assert len(streams.list_pages(store, "events")) == 1
    assert ledger_ids(store, "events") == new and all(exists(store, i) for i in new)


def test_an_overwrites_late_deletes_leave_the_pages_of_a_stream_created_again_under_the_name_alone(lc):
    """The same for the deletes after an overwrite, which its commit's multi records as a cut (the record goes with
    the stream): a driver that stalled before them must not delete a new stream's pages."""
    from connector.retention import finish_cut, overwrite_cut

    store = lc.store
    replaced = appended(store, "events", closed_ledgers(store, 600))
    cut = overwrite_cut(replaced, "job-1")
    store.create(cut.path, cut.encode())   # as the overwrite's multi writes it
    delete_head(store, "events")
    new = closed_ledgers(store, 300)
    appended(store, "events", new)
    finish_cut(lc, cut)
    assert len(streams.list_pages(store, "events")) == 1
    assert ledger_ids(store, "events") == new and all(exists(store, i) for i in new)
    assert not any(exists(store, ledger.ledger_id) for ledger in replaced.tail)   # the old stream's tail: deleted


@pytest.fixture
def proxied(metadata_uri, zookeeper):
    """A proxy between a client and ZooKeeper, and the metadata URI through it."""
    with TcpProxy(zookeeper.host, zookeeper.port) as proxy:
        yield proxy, metadata_uri.replace(zookeeper.address, proxy.address)


def test_a_planned_record_left_by_zookeeper_going_away_before_the_cut_goes_with_the_clients_next_run(
        proxied, store, monkeypatch):
    """Growth audit 2026-11-29: ZooKeeper went away between a run's plan and its cut, so the cleanup's delete of the
    planned record failed too; the record names the run's own writer, which lives on (a retention loop), and
    every later run's clean_cuts kept it for as long as the process lived. The client's next run now drops it."""
    proxy, uri = proxied
    monkeypatch.setenv("LEDGER_ZK_WAIT_SECONDS", "1")
    appended(store, "events", closed_ledgers(store, 4))

    def zookeeper_goes_away(step, cut):
        if step == PLANNED:
            proxy.set_mode("cut")   # every connection, and each the client makes again, ends at once

    with LedgerClient(uri) as lc:
        with pytest.raises(MetadataError):
            truncate_stream(lc, "events", 2 * OFFSETS, on_step=zookeeper_goes_away)
        proxy.set_mode("pass")
        assert [c.state for c in pending_cuts(store, "events")] == [PLANNED]
        poll_until(lambda: lc.store.connected and registry.writer_alive(store, lc.writer_id), 60,
                   what="the client back on ZooKeeper, its writer registered")
        assert truncate_stream(lc, "events", 2 * OFFSETS).first_offset == 2 * OFFSETS
        assert pending_cuts(store, "events") == []


def test_a_planned_record_of_a_run_still_going_in_this_process_is_left_to_it(lc):
    appended(lc.store, "events", closed_ledgers(lc.store, 4))
    cleaned = []

    def clean_meanwhile(step, cut):   # as a janitor on another thread sharing the client would
        if step == PLANNED:
            cleaned.append(clean_cuts(lc, "events"))
            assert [c.state for c in pending_cuts(lc.store, "events")] == [PLANNED]

    assert truncate_stream(lc, "events", 2 * OFFSETS, on_step=clean_meanwhile).first_offset == 2 * OFFSETS
    assert cleaned == [0] and pending_cuts(lc.store, "events") == []
