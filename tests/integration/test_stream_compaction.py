"""Compaction of small ledgers (connector/compaction.py, issue 14 item 4) against a real ZooKeeper and real nodes:
the same rows at the same offsets in fewer ledgers, reads planned before the swap still read after it, the
replaced ledgers deleted only after the grace, and a compaction killed at each step leaves the stream whole and
the next run cleans up. Arrow streams are written by the Spark write path (write_task_ledger and the driver's
commit) without a SparkSession, and read the way Spark's executors read them.
"""
import json
import subprocess
import sys
import time
import types

import pytest

from connector.cli import main
from connector.client import LedgerClient, NoSuchLedgerError, Streams, entry_time
from connector.compaction import COMPACTION_TAG, CompactionPolicy, clean_compactions, compact_stream, plan_runs
from connector.spark import LedgerDataSource, janitor
from connector.retention import apply_all, set_retention, truncate_stream
from connector.spark.errors import DataLossError
from connector.spark.row_index import RowIndex
from connector.spark.schema import OFFSET
from metadata import layout, streams
from metadata.errors import LedgerError, NoSuchStreamError, OffsetsGoneError
from metadata.model import ByteCount
from tests.harness.lost_reply import LostReplies
from tests.harness.poll import poll_until
from tests.harness.small_ledgers import rows_in, write_jobs

GRACE = 2.0


def arrow_reader(uri: str, stream: str, **options):
    source = LedgerDataSource({"metadata": uri, "path": stream, "includeMetadata": "true", **options})
    return source.reader(source.schema())


def rows_of(reader, partitions) -> list[tuple[int, int]]:
    """(offset, id) of every row the partitions hold, read as executors read them."""
    rows = []
    for partition in partitions:
        for batch in reader.read(partition):
            rows += zip(batch.column(OFFSET).to_pylist(), batch.column("id").to_pylist())
    return rows


def stream_ledgers(store, stream: str) -> list:
    return list(streams.iter_ledgers(store, streams.read_stream(store, stream).value))


def compaction_ledgers(lc: LedgerClient) -> set[int]:
    """Ledgers a compaction created, wherever they are."""
    return {i for i in lc.list_ledgers() if COMPACTION_TAG in lc.ledger_metadata(i).custom}


def cleaned_up(lc: LedgerClient, stream: str) -> bool:
    clean_compactions(lc, stream)
    return not lc.store.children(layout.COMPACTIONS)


def exists(lc: LedgerClient, ledger_id: int) -> bool:
    try:
        lc.ledger_metadata(ledger_id)
    except NoSuchLedgerError:
        return False
    return True


def test_an_arrow_stream_of_200_small_ledgers_is_compacted_with_the_same_rows_at_the_same_offsets(
        metadata_uri, cluster):
    cluster(3)
    write_jobs(metadata_uri, "events", range(200))
    with LedgerClient(metadata_uri) as lc:
        before = stream_ledgers(lc.store, "events")
        planned = arrow_reader(metadata_uri, "events")
        planned_partitions = planned.partitions()   # a batch read planned before the swap
        rows = rows_of(planned, planned_partitions)
        assert rows == [(n, n) for n in range(rows_in(200))]
        sizes = {lc.ledger_metadata(s.ledger_id).length for s in before}
        policy = CompactionPolicy(target_bytes=40 * max(sizes), grace=GRACE)

        result = compact_stream(lc, "events", policy)

        after = stream_ledgers(lc.store, "events")
        assert [r.state for r in result.runs] == ["swapped"] and result.runs[0].replaced == 199
        assert 5 <= len(after) <= 10 and after[-1] == before[-1]   # 40 ledgers a new one; the last one stays
        assert rows_of(planned, planned_partitions) == rows          # planned before, executed after the swap
        reader = arrow_reader(metadata_uri, "events")
        assert rows_of(reader, reader.partitions()) == rows
        seek = arrow_reader(metadata_uri, "events", startingOffsets="333", endingOffsets="345")
        assert rows_of(seek, seek.partitions()) == rows[333:345]
        new = lc.ledger_metadata(after[0].ledger_id)
        assert (new.ensemble_size, new.write_quorum, new.ack_quorum) == (2, 2, 2)
        assert RowIndex.of(new) is not None and new.custom[COMPACTION_TAG] == result.runs[0].compaction_id

        replaced = [s.ledger_id for s in before[:-1]]
        assert all(exists(lc, i) for i in replaced)                  # until the grace has passed
        poll_until(lambda: cleaned_up(lc, "events"), timeout=30, what="the grace to pass")
        assert not any(exists(lc, i) for i in replaced)
        assert rows_of(reader, reader.partitions()) == rows
        assert plan_runs(lc, streams.read_stream(lc.store, "events").value, policy, b"") == []   # nothing left


def test_a_raw_stream_is_compacted_entry_for_entry_across_pages_while_its_writer_goes_on(
        metadata_uri, cluster, monkeypatch):
    # Pages of 16 ledgers instead of 256 (test_stream_pages.py covers the real size): the same paging, with
    # the stream's 44 ledgers in two sealed pages and a tail, and 16 times fewer appends.
    monkeypatch.setattr(streams, "PAGE_LEDGERS", 16)
    cluster(3)
    with LedgerClient(metadata_uri) as lc:
        writer = Streams(lc).open_writer("raw", ensemble_size=3, write_quorum=2, ack_quorum=2, max_ledger_entries=2)
        for n in range(88):
            writer.append(f"p-{n}".encode())
        before = stream_ledgers(lc.store, "raw")
        assert len(before) == 44 and len(streams.list_pages(lc.store, "raw")) == 2
        old_head = streams.read_stream(lc.store, "raw").value
        reading = Streams(lc).read("raw")
        first_half = [next(reading) for _ in range(31)]              # a read going on during the compaction

        result = compact_stream(lc, "raw", CompactionPolicy(target_bytes=200, grace=GRACE))

        for n in range(88, 96):                                      # the owner keeps appending and rolling
            writer.append(f"p-{n}".encode())
        writer.close()
        after = stream_ledgers(lc.store, "raw")
        assert all(r.state == "swapped" for r in result.runs) and len(after) < len(before) // 2
        entries = [(e.offset, e.payload) for e in Streams(lc).read("raw")]
        assert entries == [(n, f"p-{n}".encode()) for n in range(96)]
        assert [(e.offset, e.payload) for e in first_half + list(reading)] == entries[:88]
        new = lc.ledger_metadata(after[0].ledger_id)
        assert after[0].last_offset - after[0].first_offset == new.last_entry_id   # one entry per offset
        assert list(streams.iter_ledgers(lc.store, old_head)) == before   # a head read before the swap, still whole

        poll_until(lambda: cleaned_up(lc, "raw"), timeout=30, what="the grace to pass")
        assert not any(exists(lc, s.ledger_id) for s in before[:-1])
        head = streams.read_stream(lc.store, "raw").value
        assert streams.list_pages(lc.store, "raw") == streams.live_pages(lc.store, head)   # replaced pages gone
        assert [(e.offset, e.payload) for e in Streams(lc).read("raw")] == entries


def twenty_small_ledgers(lc: LedgerClient) -> list:
    """The raw stream "raw": entries p-0..p-39, two per ledger; its ledgers."""
    with Streams(lc).open_writer("raw", ensemble_size=3, write_quorum=2, ack_quorum=2, max_ledger_entries=2) as w:
        for n in range(40):
            w.append(f"p-{n}".encode())
    return stream_ledgers(lc.store, "raw")


def test_a_truncation_during_the_compaction_refuses_the_swap_and_the_new_ledgers_go(metadata_uri, cluster):
    cluster(3)
    with LedgerClient(metadata_uri) as lc:
        before = twenty_small_ledgers(lc)

        def truncate_once(step, compaction):
            if step == "written":
                streams.update_stream(lc.store, "raw", lambda r: r.replace(
                    first_offset=before[3].first_offset, tail=r.tail[3:]))

        result = compact_stream(lc, "raw", CompactionPolicy(target_bytes=1 << 20, grace=GRACE), on_step=truncate_once)

        assert [r.state for r in result.runs] == ["abandoned"]
        assert stream_ledgers(lc.store, "raw") == before[3:] and compaction_ledgers(lc) == set()
        assert lc.store.children(layout.COMPACTIONS) == []
        assert [e.payload for e in Streams(lc).read("raw", before[3].first_offset)] == [
            f"p-{n}".encode() for n in range(6, 40)]


def test_pages_a_truncation_deleted_while_the_swap_read_them_leave_the_run_as_it_was(metadata_uri, cluster,
                                                                                       monkeypatch):
    """Review 2026-11-29: a truncation deleting pages between the swap's read of the head and its reads of the
    run's pages raised OffsetsGoneError through the swap, which failed the whole compaction instead of leaving
    that run as it was (as a changed run is)."""
    monkeypatch.setattr(streams, "PAGE_LEDGERS", 4)
    cluster(3)
    with LedgerClient(metadata_uri) as lc:
        before = twenty_small_ledgers(lc)
        read_page = streams.read_page
        swapping = []

        def gone_while_swapping(store, name, page):
            if swapping:
                raise OffsetsGoneError(f"stream {name!r}: offsets {page.first_offset}.. left the stream (scripted)")
            return read_page(store, name, page)

        monkeypatch.setattr(streams, "read_page", gone_while_swapping)
        result = compact_stream(lc, "raw", CompactionPolicy(target_bytes=1 << 20, grace=GRACE),
                                on_step=lambda step, compaction: swapping.append(step) if step == "written" else None)
        monkeypatch.setattr(streams, "read_page", read_page)
        assert [r.state for r in result.runs] == ["abandoned"]
        assert stream_ledgers(lc.store, "raw") == before and compaction_ledgers(lc) == set()
        assert lc.store.children(layout.COMPACTIONS) == []


@pytest.mark.parametrize("crash_at", ["recorded", "created", "written", "swapped"])
def test_a_compaction_killed_at_each_step_leaves_the_stream_whole_and_the_next_run_cleans_up(
        metadata_uri, cluster, crash_at):
    cluster(3)
    with LedgerClient(metadata_uri) as lc:
        with Streams(lc).open_writer("raw", ensemble_size=3, write_quorum=2, ack_quorum=2, max_ledger_entries=2) as w:
            for n in range(100):
                w.append(f"p-{n}".encode())
        entries = [(e.offset, e.payload) for e in Streams(lc).read("raw")]
        before = stream_ledgers(lc.store, "raw")

        # 180 bytes: groups of 7 of these ledgers (two entries of 8 bytes of time and 3-4 of payload each), so the
        # one run covers every ledger but the last
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.harness.compaction_process", metadata_uri, "raw", "180", "2", crash_at],
            stdout=subprocess.PIPE, text=True)
        try:
            lines = iter(process.stdout.readline, "")
            assert f"stopped {crash_at}" in (line.strip() for line in lines)
        finally:
            process.kill()
            process.wait()

        assert [(e.offset, e.payload) for e in Streams(lc).read("raw")] == entries   # readable and complete
        swapped = crash_at == "swapped"
        assert (stream_ledgers(lc.store, "raw") != before) == swapped
        left = compaction_ledgers(lc)
        assert bool(left) == (crash_at != "recorded")

        # The next run undoes the dead compaction once its ZooKeeper session is gone (or, swapped, deletes the
        # replaced ledgers after the grace), then compacts what is left.
        poll_until(lambda: cleaned_up(lc, "raw"), timeout=60, interval=0.5, what="the cleanup")
        if swapped:
            assert not any(exists(lc, s.ledger_id) for s in before[:-1]) and left <= {
                s.ledger_id for s in stream_ledgers(lc.store, "raw")}
        else:
            assert compaction_ledgers(lc) == set() and stream_ledgers(lc.store, "raw") == before
        compact_stream(lc, "raw", CompactionPolicy(target_bytes=60, grace=GRACE), wait=True)
        assert [(e.offset, e.payload) for e in Streams(lc).read("raw")] == entries
        assert len(stream_ledgers(lc.store, "raw")) < len(before) and lc.store.children(layout.COMPACTIONS) == []
        assert all(exists(lc, s.ledger_id) for s in stream_ledgers(lc.store, "raw"))


def test_the_compact_command_copies_raw_entries_over_the_default_limit_with_max_entry_bytes(metadata_uri, cluster,
                                                                                             capsys):
    """On nodes that take 16 MiB entries, a raw stream holds a 9 MiB one: `ledger stream compact` refuses it with
    the client's default limit (8 MiB), says which limit, and leaves the stream as it was; with
    --max-entry-bytes raised as the nodes' is, it compacts it like any other."""
    limit = 16 << 20
    cluster(3, "--max-entry-bytes", str(limit))
    payloads = [b"small-0", b"L" * (9 << 20), b"small-2", b"small-3", b"small-4"]
    with LedgerClient(metadata_uri, max_entry_bytes=limit) as lc:
        with Streams(lc).open_writer("big", ensemble_size=3, write_quorum=2, ack_quorum=2, max_ledger_entries=2) as w:
            for payload in payloads:
                w.append(payload)
        before = stream_ledgers(lc.store, "big")
        command = ["stream", "compact", "big", "--metadata", metadata_uri, "--target-bytes", str(64 << 20), "--grace",
                   "0.1", "--wait"]

        assert main(command) == 1
        error = capsys.readouterr().err
        assert error.startswith("ledger: error: ") and "over the 8,388,608 bytes" in error, error
        assert "Traceback" not in error
        assert stream_ledgers(lc.store, "big") == before
        assert [e.payload for e in Streams(lc).read("big")] == payloads

        assert main([*command, "--max-entry-bytes", str(limit)]) == 0
        assert len(stream_ledgers(lc.store, "big")) < len(before)
        assert [e.payload for e in Streams(lc).read("big")] == payloads
        poll_until(lambda: cleaned_up(lc, "big"), timeout=30, what="the refused run's new ledgers to go")

    with pytest.raises(SystemExit):
        main([*command, "--max-entry-bytes", str(1 << 30)])
    assert "the most one message to a storage node carries" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*command, "--max-entry-bytes", "8"])
    assert "8 is under 1,024, the least an entry limit may be" in capsys.readouterr().err


def test_the_compact_command_prints_what_it_did_and_with_wait_deletes_after_the_grace(metadata_uri, cluster, capsys):
    cluster(3)
    def compact(*extra: str) -> str:
        assert main(["stream", "compact", "raw", "--metadata", metadata_uri, "--target-bytes", "100", *extra]) == 0
        return capsys.readouterr().out

    def append(lc: LedgerClient, entries: range) -> None:
        with Streams(lc).open_writer("raw", ensemble_size=3, write_quorum=2, ack_quorum=2, max_ledger_entries=2) as w:
            for n in entries:
                w.append(f"p-{n}".encode())

    with LedgerClient(metadata_uri) as lc:
        append(lc, range(40))
        before = stream_ledgers(lc.store, "raw")
        assert "0 ledgers rewritten into 0" in compact("--min-ledgers", "100")   # fewer small ledgers than that

        outcome = json.loads(compact("--grace", "1", "--wait", "--json"))
        (run,) = outcome["runs"]
        assert run["replaced"] == 19 and outcome["finished"] == [run["compaction_id"]] and outcome["pending"] == []
        assert not any(exists(lc, s.ledger_id) for s in before[:-1])

        append(lc, range(40, 80))
        printed = compact()
        assert "ledgers rewritten into" in printed and "kept until" in printed
        assert [e.payload for e in Streams(lc).read("raw")] == [f"p-{n}".encode() for n in range(80)]


def test_an_arrow_compaction_cuts_its_entries_to_the_clients_entry_limit(metadata_uri, cluster):
    """--entry-bytes over the client's entry limit (--max-entry-bytes): the rows go into more entries, each within
    the limit with its time frame, as a Spark write task cuts them, instead of the compaction failing. Each
    ledger's 1,000 rows are one entry with one time (8 KiB), which a compaction keeps together unless cut."""
    cluster(3)
    write_jobs(metadata_uri, "limited", range(4), per_ledger=1000)
    limit = 4096
    with LedgerClient(metadata_uri, max_entry_bytes=limit) as lc:
        result = compact_stream(lc, "limited", CompactionPolicy(target_bytes=1 << 20, entry_bytes=1 << 20,
                                                                grace=GRACE))
        assert [(r.state, r.replaced) for r in result.runs] == [("swapped", 3)]
        new = stream_ledgers(lc.store, "limited")[0]
        entries = list(lc.open_ledger(new.ledger_id).read())
        assert len(entries) > 3 and all(len(e.payload) + entry_time.FRAME.size <= limit for e in entries)
        reader = arrow_reader(metadata_uri, "limited")
        assert rows_of(reader, reader.partitions()) == [(n, n) for n in range(4000)]


def test_a_row_over_the_entry_limit_stops_the_compaction_in_its_own_words_and_leaves_the_stream(metadata_uri,
                                                                                                  cluster):
    cluster(3)
    write_jobs(metadata_uri, "tight", range(4))
    with LedgerClient(metadata_uri, max_entry_bytes=64) as lc:   # less than any arrow entry of one row
        before = stream_ledgers(lc.store, "tight")
        with pytest.raises(LedgerError, match=r"a row alone is over the entry limit of 56 bytes \(--max-entry-bytes "
                                              r"less the time frame\).*nothing of the run was swapped in"):
            compact_stream(lc, "tight", CompactionPolicy(target_bytes=1 << 20, grace=GRACE))
        assert stream_ledgers(lc.store, "tight") == before
        poll_until(lambda: cleaned_up(lc, "tight"), timeout=30, what="the compaction's record to be cleaned up")
        assert not compaction_ledgers(lc)


def test_a_compaction_plan_reads_only_the_ledgers_that_can_still_change(metadata_uri, monkeypatch):
    """Rule 15: every compaction plan read the metadata of every ledger of the stream (a cron'd compaction of a
    stream of a million ledgers read a million znodes each run, with nothing to do). A plan now starts where the last
    one under the same policy said nothing before can change; another policy plans the whole stream once."""
    from tests.harness.stream_fixtures import appended, closed_ledgers

    with LedgerClient(metadata_uri) as lc:
        large = closed_ledgers(lc.store, 300, length=1 << 30)   # none of them small
        appended(lc.store, "events", large)
        policy = CompactionPolicy(target_bytes=1 << 20)
        read = []
        real = lc.ledger_metadata
        monkeypatch.setattr(lc, "ledger_metadata", lambda ledger_id: read.append(ledger_id) or real(ledger_id))
        assert plan_runs(lc, streams.read_stream(lc.store, "events").value, policy, b"") == []
        assert len(read) == 299                                          # the first plan: all but the last
        new = closed_ledgers(lc.store, 5, length=1 << 30)
        appended(lc.store, "events", new)
        read.clear()
        assert plan_runs(lc, streams.read_stream(lc.store, "events").value, policy, b"") == []
        assert sorted(read) == [large[-1]] + new[:-1]                    # what came since, and no more
        read.clear()
        plan_runs(lc, streams.read_stream(lc.store, "events").value, CompactionPolicy(target_bytes=1 << 21), b"")
        assert len(read) == 304                                          # another policy: the whole stream, once


def test_a_job_start_on_the_stream_deletes_what_a_compaction_replaced_once_its_grace_has_passed(metadata_uri,
                                                                                            cluster):
    """Day-300 audit 2026-11-29: a compaction run without --wait and never again kept the ledgers it replaced (and
    their pages) for good: only the next compaction of the stream deleted them. A job's start on the stream (its
    janitor) now does too."""
    cluster(3)
    write_jobs(metadata_uri, "events", range(20))
    with LedgerClient(metadata_uri) as lc:
        before = stream_ledgers(lc.store, "events")
        result = compact_stream(lc, "events", CompactionPolicy(target_bytes=1 << 20, grace=GRACE))
        assert [r.state for r in result.runs] == ["swapped"]
        replaced = [s.ledger_id for s in before[:-1]]
        janitor.clean_stream(lc, "events", b"")
        assert all(exists(lc, i) for i in replaced)                  # still in its grace
        poll_until(lambda: not janitor.clean_stream(lc, "events", b"") and not lc.store.children(layout.COMPACTIONS),
                   timeout=30, what="a job start past the grace to finish the compaction")
        assert not any(exists(lc, i) for i in replaced)


def small_raw_stream(lc: LedgerClient, name: str, entries: int, first: int = 0) -> None:
    """entries raw entries in ledgers of two (a new writer: it closes the last one)."""
    with Streams(lc).open_writer(name, ensemble_size=3, write_quorum=2, ack_quorum=2, max_ledger_entries=2) as w:
        for n in range(first, first + entries):
            w.append(f"p-{n}".encode())


def test_a_compaction_adjusts_retentions_byte_count_and_the_next_run_counts_only_what_came_since(
        metadata_uri, cluster, monkeypatch):
    """Day-300 audit 2026-11-29 (rule 15): a compaction of offsets retention had counted dropped the stream's byte
    count, so the retention run after every compaction read every ledger's length again. The swap now adjusts the
    count (the new ledgers' lengths for the run's), here for a run that starts in the counted offsets and goes on
    past them."""
    from connector import retention

    cluster(3)
    with LedgerClient(metadata_uri) as lc:
        with Streams(lc).open_writer("sized", ensemble_size=3, write_quorum=2, ack_quorum=2,
                                     max_ledger_entries=2) as w:
            for n in range(40):
                w.append(b"x" * 20_000)   # 20 ledgers of 40 KB: not small, never compacted
            for n in range(20):
                w.append(f"s-{n}".encode())   # 10 small ones
        retention.set_retention(lc.store, "sized", max_bytes=1 << 40)
        retention.apply_retention(lc, "sized")   # counts the stream and stores the count
        counted = streams.read_stream(lc.store, "sized").value.byte_count
        assert counted.end_offset == 60
        small_raw_stream(lc, "sized", 10, first=20)   # 5 small ledgers more, after the count

        reads: list[int] = []
        read_length = retention._LedgerFacts._read_length
        monkeypatch.setattr(retention._LedgerFacts, "_read_length",
                            lambda facts, ledger_id: reads.append(ledger_id) or read_length(facts, ledger_id))
        retention.apply_retention(lc, "sized")
        assert len(reads) == 5   # what came since the count, not the stream's 35 ledgers

        result = compact_stream(lc, "sized", CompactionPolicy(target_bytes=30_000, grace=GRACE))
        (run,) = result.runs
        assert run.state == "swapped" and (run.first_offset, run.last_offset) == (40, 67)   # 14 of the 15 small
        head = streams.read_stream(lc.store, "sized").value
        closed = [s for s in streams.iter_ledgers(lc.store, head) if s.last_offset < 68]
        assert head.byte_count == ByteCount(0, 68, sum(lc.ledger_metadata(s.ledger_id).length for s in closed))

        reads.clear()
        assert not retention.apply_retention(lc, "sized").cut
        assert reads == [stream_ledgers(lc.store, "sized")[-1].ledger_id]   # the one ledger after the run


def planned_read(uri: str, stream: str, **options) -> tuple:
    """A batch read planned now, to be read later: its reader and partitions."""
    reader = arrow_reader(uri, stream, **options)
    return reader, reader.partitions()


def test_a_truncation_deletes_what_a_compaction_of_tail_ledgers_replaced_below_it_at_once(metadata_uri, cluster):
    """Day-300 audit 2026-11-29: the ledgers a compaction replaced in the tail are named in its record only, and only
    a compaction or a Spark job start finished records. A stream compacted once (without --wait) and then only
    truncated kept them, and the truncated rows readable by ledger id, for good. A cut now finishes the stream's
    compactions, and at once those whose run it took off whole: a read planned on those ledgers gets
    failOnDataLoss, as for any ledger a cut deletes."""
    cluster(3)
    write_jobs(metadata_uri, "events", range(20))
    with LedgerClient(metadata_uri) as lc:
        before = stream_ledgers(lc.store, "events")
        planned = planned_read(metadata_uri, "events")   # batch reads planned before the swap
        skipping = planned_read(metadata_uri, "events", failOnDataLoss="false")
        result = compact_stream(lc, "events", CompactionPolicy(target_bytes=1 << 20, grace=3600))
        assert [r.state for r in result.runs] == ["swapped"]

        cut = truncate_stream(lc, "events", before[-1].first_offset)   # every offset of the run

        assert cut.first_offset == before[-1].first_offset and stream_ledgers(lc.store, "events") == before[-1:]
        assert not any(exists(lc, s.ledger_id) for s in before[:-1]) and compaction_ledgers(lc) == set()
        assert lc.store.children(layout.COMPACTIONS) == []
        with pytest.raises(DataLossError, match=f"first offset the stream still holds is {cut.first_offset}"):
            rows_of(*planned)
        assert rows_of(*skipping) == [
            (n, n) for n in range(before[-1].first_offset, rows_in(20))]


def test_a_retention_run_finishes_a_compaction_past_its_grace(metadata_uri, cluster):
    """Day-300 audit 2026-11-29: a stream whose only maintenance is the retention loop kept what a compaction (without
    --wait) replaced for good: the loop never finished compactions."""
    cluster(3)
    with LedgerClient(metadata_uri) as lc:
        small_raw_stream(lc, "raw", 20)
        before = stream_ledgers(lc.store, "raw")
        compact_stream(lc, "raw", CompactionPolicy(target_bytes=1 << 20, grace=GRACE))
        set_retention(lc.store, "raw", max_age=86_400)   # nothing is that old
        apply_all(lc)
        assert all(exists(lc, s.ledger_id) for s in before[:-1])   # in its grace
        poll_until(lambda: apply_all(lc) and not lc.store.children(layout.COMPACTIONS), timeout=30, interval=0.5,
                   what="a retention run past the grace to finish the compaction")
        assert not any(exists(lc, s.ledger_id) for s in before[:-1])
        assert [e.payload for e in Streams(lc).read("raw")] == [f"p-{n}".encode() for n in range(20)]


def test_stream_delete_deletes_the_ledgers_and_records_of_its_compactions(metadata_uri, cluster):
    """Day-300 audit 2026-11-29: `ledger stream delete` deleted the ledgers the stream's metadata named, not those
    named in its compaction records: the ledgers a swapped compaction replaced (in the tail: its record names them
    alone), the new ledgers of a compaction whose process died, and the records, which every later compaction and
    job start lists."""
    cluster(3)
    with LedgerClient(metadata_uri) as lc:
        small_raw_stream(lc, "raw", 40)
        before = stream_ledgers(lc.store, "raw")
        result = compact_stream(lc, "raw", CompactionPolicy(target_bytes=1 << 20, grace=3600))   # without --wait
        assert [r.state for r in result.runs] == ["swapped"]
        small_raw_stream(lc, "raw", 40, first=40)
        process = subprocess.Popen(   # a compaction that dies with its new ledgers written, before its swap
            [sys.executable, "-m", "tests.harness.compaction_process", metadata_uri, "raw", "1000000", "3600",
             "written"], stdout=subprocess.PIPE, text=True)
        try:
            assert "stopped written" in (line.strip() for line in iter(process.stdout.readline, ""))
        finally:
            process.kill()
            process.wait()
        assert len(lc.store.children(layout.COMPACTIONS)) == 2 and compaction_ledgers(lc) - {
            s.ledger_id for s in stream_ledgers(lc.store, "raw")}

        assert main(["stream", "delete", "raw", "--yes", "--metadata", metadata_uri]) == 0

        assert not any(exists(lc, s.ledger_id) for s in before) and lc.list_ledgers() == []
        assert lc.store.children(layout.COMPACTIONS) == []


def test_a_compaction_cannot_swap_into_a_stream_deleted_meanwhile(metadata_uri, cluster):
    """The swap is one multi with the head's compare-and-set: with the head gone it fails, the compaction undoes
    itself, and nothing of it (nor of the stream) is left."""
    cluster(3)
    with LedgerClient(metadata_uri) as lc:
        small_raw_stream(lc, "raw", 40)

        def delete_stream(step, compaction):
            if step == "written":
                assert main(["stream", "delete", "raw", "--yes", "--metadata", metadata_uri]) == 0

        with pytest.raises(NoSuchStreamError):
            compact_stream(lc, "raw", CompactionPolicy(target_bytes=1 << 20, grace=3600), on_step=delete_stream)
        assert streams.find_stream(lc.store, "raw") is None
        assert lc.list_ledgers() == [] and lc.store.children(layout.COMPACTIONS) == []


def test_the_grace_is_judged_by_zookeepers_clock_not_the_compacting_hosts(metadata_uri, cluster, monkeypatch):
    """Day-300 audit 2026-11-29: the swap recorded the compacting host's time, and a cleaner compared it with its
    own clock: a compactor whose clock ran behind the cleaner's by more than the grace had its replaced ledgers
    deleted at once. The grace now runs from the record's last write (the swap) by ZooKeeper's clock."""
    from connector import compaction

    cluster(3)
    with LedgerClient(metadata_uri) as lc:
        small_raw_stream(lc, "raw", 20)
        before = stream_ledgers(lc.store, "raw")
        behind = types.SimpleNamespace(time=lambda: time.time() - 3600, sleep=time.sleep)
        with monkeypatch.context() as patched:
            patched.setattr(compaction, "time", behind)   # the compacting host's clock, an hour behind
            result = compact_stream(lc, "raw", CompactionPolicy(target_bytes=1 << 20, grace=60))
        assert clean_compactions(lc, "raw").finished == []
        assert all(exists(lc, s.ledger_id) for s in before[:-1])   # in its grace
        ((_, due),) = result.pending
        assert abs(due - (time.time() + 60)) < 10
        assert clean_compactions(lc, "raw", now=time.time() + 70).finished == [result.runs[0].compaction_id]
        assert not any(exists(lc, s.ledger_id) for s in before[:-1])


def test_a_compaction_whose_record_create_lost_its_reply_leaves_no_record(metadata_uri, cluster, monkeypatch):
    """Lost-reply audit 2026-11-29 (finding 5): the create of a compaction's record ran before the try that undoes a
    failed run. When it landed and its reply was lost, the record stayed RUNNING: clean_compactions undoes a running
    record only once its writer is gone, so a live process (a retention loop, a notebook) kept it for its life."""
    cluster(3)
    with LedgerClient(metadata_uri) as lc:
        with Streams(lc).open_writer("raw", max_ledger_entries=1) as writer:
            for i in range(6):
                writer.append(b"p%d" % i)
        lost = LostReplies(monkeypatch, lambda operation, path, kwargs: operation == "create" and path.startswith(
            f"{layout.COMPACTIONS}/"))
        with pytest.raises(LedgerError, match="ConnectionLoss"):
            compact_stream(lc, "raw", CompactionPolicy(target_bytes=1 << 20))
        assert lost.lost
        assert [child for child in lc.store.children(layout.COMPACTIONS) if child.startswith("raw@")] == []
        assert [entry.payload for entry in Streams(lc).read("raw", 0)] == [b"p%d" % i for i in range(6)]
