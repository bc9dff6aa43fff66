"""Entry times and the time search (issue 16 item 1) against real ZooKeeper and storage node processes.

Every entry a stream writer appends carries its append time; reads return the payload as written and the
time; a search for the first offset at or after a time reads O(log) ledger metadata and entries (counted
on the real store and with the client's metrics), across sealed pages, equal times across ledger
boundaries, the OPEN tail of a live writer, ledgers closed by a recovery and ledgers written before entry
times existed.
"""
import json
import math
import time

import pytest

from connector.client import LedgerClient, Streams, metrics
from connector.client.entry_time import FIRST_KEY, LAST_KEY, TIME_KEY, AppendClock, LedgerTimes
from connector.client.time_search import TimeSearch, first_offset_at_or_after
from connector.compaction import CompactionPolicy, compact_stream
from connector.spark.options import LedgerOptions
from connector.spark.read import LedgerReader
from connector.spark.schema import raw_read_schema
from connector.spark.stream_options import StreamOptions
from connector.spark.stream_read import LedgerStreamReader
from metadata import layout, streams
from metadata.model import StreamLedger, StreamRecord
from tests.harness.poll import poll_until

BASE = 1_700_000_000_000
LEDGERS = layout.ledger_path(0).rsplit("/", 1)[0] + "/"   # ledger znodes


@pytest.fixture
def client(cluster, metadata_uri):
    cluster(3)
    with LedgerClient(metadata_uri) as c:
        yield c


def scripted_clock(times_ms):
    """A writer's clock that reads the given times (ms) in turn, then stays at the last."""
    readings = iter(times_ms)
    last = [0]

    def now():
        last[0] = next(readings, last[0])
        return last[0] / 1000
    return AppendClock(now=now)


def entries_read() -> float:
    return metrics.REGISTRY.get_sample_value("ledger_client_entries_read_total") or 0.0


class CountingStore:
    """Counts the real store's ledger-metadata reads (znode reads and stats) and page reads (page znodes and
    page listings) while installed."""

    def __init__(self, store):
        self.store = store
        self.ledgers = 0
        self.pages = 0

    def __enter__(self):
        store = self.store
        self._originals = {name: getattr(store, name) for name in ("read", "modified_at", "children")}

        def counted(name):
            original = self._originals[name]

            def call(path, *args, **kwargs):
                if "/pages" in path or "/books" in path:
                    self.pages += 1
                elif path.startswith(LEDGERS):
                    self.ledgers += 1
                return original(path, *args, **kwargs)
            return call
        for name in self._originals:
            setattr(store, name, counted(name))
        return self

    def __exit__(self, *exc):
        for name in self._originals:
            delattr(self.store, name)   # the class's methods again


def test_a_stream_writer_stamps_every_entry_and_readers_get_the_payload_back(client):
    before = int(time.time() * 1000)
    with Streams(client).open_writer("stamped", max_ledger_entries=3) as writer:
        for i in range(7):
            writer.append(f"e{i}".encode())
    after = int(time.time() * 1000)
    read = list(Streams(client).read("stamped"))
    assert [e.payload for e in read] == [f"e{i}".encode() for i in range(7)]
    times = [e.time_ms for e in read]
    assert times == sorted(times) and before <= times[0] and times[-1] <= after
    for ledger in streams.read_stream(client.store, "stamped").value.tail:
        meta = client.ledger_metadata(ledger.ledger_id)
        assert meta.custom[TIME_KEY] == "1"
        mine = [e.time_ms for e in read if e.ledger_id == ledger.ledger_id]
        assert LedgerTimes.of(meta) == LedgerTimes(mine[0], mine[-1])
    # the bytes on the nodes carry the time in front of the payload, covered by the entry digest
    assert meta.length == sum(8 + len(e.payload) for e in read if e.ledger_id == ledger.ledger_id)


@pytest.mark.parametrize("book_pages", [1024, 4], ids=["one-book", "four-books"])
def test_a_search_over_many_ledgers_reads_logarithmically_many_ledgers_and_entries(client, monkeypatch, book_pages):
    # Pages of 16 ledgers instead of 256: 256 ledgers fill 15 sealed pages and a tail, and the page bound bites;
    # in books of 4 pages, the search goes over the books first, then the pages of one
    monkeypatch.setattr(streams, "PAGE_LEDGERS", 16)
    monkeypatch.setattr(streams, "BOOK_PAGES", book_pages)
    ledgers, per_ledger = 256, 4
    count = ledgers * per_ledger
    # entry n was appended at BASE + n // 3: runs of equal times cross ledger boundaries
    clock = scripted_clock([BASE + n // 3 for n in range(count)])
    with Streams(client).open_writer("many", max_ledger_entries=per_ledger, clock=clock) as writer:
        futures = [writer.append_async(f"e{n}".encode()) for n in range(count)]
        assert [f.result() for f in futures] == list(range(count))
    record = streams.read_stream(client.store, "many").value
    assert record.tail_offset > 0 and len(streams.list_pages(client.store, "many")) >= 15   # sealed pages

    for k in (0, 1, 2, count // 6, count // 3 - 1, count // 3, count // 3 + 1):
        target = BASE + k
        search = TimeSearch(client, record)
        before = entries_read()
        with CountingStore(client.store) as counted:
            found = search.first_offset_at_or_after(target)
        expected = 3 * k if 3 * k < count else None
        assert found == expected, k
        bound = 2 * math.log2(ledgers)
        assert counted.ledgers <= bound, (k, counted.ledgers, search.cost)
        assert search.cost.entries <= math.ceil(math.log2(per_ledger)) + 1
        assert entries_read() - before == search.cost.entries
        # the book names, then per region probed its listing and last page, then the pages of the one found
        regions = len(streams.regions(client.store, record)) + 1
        pages = min(book_pages, ledgers // streams.PAGE_LEDGERS)
        assert counted.pages <= 1 + 2 * math.ceil(math.log2(regions + 1)) + math.ceil(math.log2(pages + 1))


def test_a_search_inside_one_large_ledger_reads_logarithmically_many_entries(client):
    clock = scripted_clock([BASE + n for n in range(1000)])
    with Streams(client).open_writer("large", clock=clock) as writer:
        for future in [writer.append_async(b"x") for _ in range(1000)]:
            future.result()
    record = streams.read_stream(client.store, "large").value
    search = TimeSearch(client, record)
    assert search.first_offset_at_or_after(BASE + 777) == 777
    assert search.cost.entries <= math.ceil(math.log2(1000)) + 1


def test_the_open_tail_of_a_live_writer_is_searched_up_to_its_lac(client):
    clock = scripted_clock([BASE + 10 * n for n in range(20)])
    writer = Streams(client).open_writer("live", max_ledger_entries=8, clock=clock)
    try:
        for n in range(20):
            writer.append(f"e{n}".encode())
        record = streams.read_stream(client.store, "live").value
        assert record.last_ledger.last_offset is None   # the tail is OPEN
        # the idle writer's explicit LAC brings every node up to entry 19
        poll_until(lambda: first_offset_at_or_after(client, record, BASE + 190) == 19, 30, what="the last entry")
        assert first_offset_at_or_after(client, record, BASE + 165) == 17
        assert first_offset_at_or_after(client, record, BASE + 191) is None
    finally:
        writer.close()


def test_a_new_owner_never_stamps_below_its_predecessors_last_time(client, metadata_uri):
    ahead = scripted_clock([BASE + 5_000 + n for n in range(5)])
    behind = scripted_clock([BASE + n for n in range(5)])
    first = LedgerClient(metadata_uri)
    try:
        owner = Streams(first).open_writer("handover", clock=ahead)
        for n in range(5):
            owner.append(f"a{n}".encode())
        # the first owner never closes (it crashed): the next one recovers its ledger, which then has no times
        # recorded in its metadata, and reads its last entry's time
        with LedgerClient(metadata_uri) as other, Streams(other).open_writer("handover", clock=behind) as second:
            recovered = streams.read_stream(other.store, "handover").value.tail[0]
            assert LAST_KEY not in other.ledger_metadata(recovered.ledger_id).custom
            for n in range(5):
                second.append(f"b{n}".encode())
    finally:
        first.close()
    times = [e.time_ms for e in Streams(client).read("handover")]
    assert times == [BASE + 5_000 + n for n in range(5)] + [BASE + 5_004] * 5
    record = streams.read_stream(client.store, "handover").value
    assert first_offset_at_or_after(client, record, BASE + 5_004) == 4      # the recovered ledger: entries read
    assert first_offset_at_or_after(client, record, BASE + 5_005) is None


def old_format_ledger(client, stream, payloads) -> int:
    """A ledger as a stream writer wrote it before entry times existed (no mark, payloads as they are), put on
    the stream as its first closed ledger."""
    with client.create_ledger(custom_metadata={"stream": stream}) as ledger:
        for payload in payloads:
            ledger.append(payload)
    streams.update_stream(client.store, stream, lambda r: r.replace(
        tail=r.tail + (StreamLedger(ledger.ledger_id, r.next_offset, r.next_offset + len(payloads) - 1),)),
        create=StreamRecord(stream, "raw"))
    return ledger.ledger_id


def test_ledgers_written_before_entry_times_read_as_before_and_are_searched_by_their_close_time(client):
    old = old_format_ledger(client, "mixed", [b"\x00\x00old-1", b"old-2"])
    closed_at = int(client.store.modified_at(layout.ledger_path(old)) * 1000)
    meta = client.ledger_metadata(old)
    assert FIRST_KEY not in meta.custom and TIME_KEY not in meta.custom
    later = int(time.time() * 1000) + 10_000
    with Streams(client).open_writer("mixed", clock=scripted_clock([later, later + 1])) as writer:
        writer.append(b"new-1")
        writer.append(b"new-2")
    read = [(e.offset, e.payload, e.time_ms) for e in Streams(client).read("mixed")]
    assert read == [(0, b"\x00\x00old-1", None), (1, b"old-2", None), (2, b"new-1", later), (3, b"new-2", later + 1)]
    record = streams.read_stream(client.store, "mixed").value
    assert BASE < closed_at < later
    assert first_offset_at_or_after(client, record, closed_at) == 0       # closed at that time: all of it counts
    assert first_offset_at_or_after(client, record, closed_at + 1) == 2   # closed before: none of it
    assert first_offset_at_or_after(client, record, later) == 2
    assert first_offset_at_or_after(client, record, later + 1) == 3


def test_compaction_keeps_every_entrys_time_and_runs_never_mix_old_and_timed_ledgers(client):
    old_format_ledger(client, "compacted", [b"o0", b"o1"])
    old_format_ledger(client, "compacted", [b"o2", b"o3"])
    start = int(time.time() * 1000) + 10_000   # after the old ledgers' close: a new owner never stamps below it
    clock = scripted_clock([start + 10 * n for n in range(20)])
    with Streams(client).open_writer("compacted", max_ledger_entries=2, clock=clock) as writer:
        for n in range(20):
            writer.append(f"e{n}".encode())
    before = [(e.offset, e.payload, e.time_ms) for e in Streams(client).read("compacted")]
    assert [t for _, _, t in before] == [None] * 4 + [start + 10 * n for n in range(20)]
    ledgers_before = len(list(streams.iter_ledgers(client.store, streams.read_stream(client.store, "compacted").value)))

    result = compact_stream(client, "compacted", CompactionPolicy(target_bytes=1000, grace=0.0), wait=True)

    assert [(e.offset, e.payload, e.time_ms) for e in Streams(client).read("compacted")] == before
    record = streams.read_stream(client.store, "compacted").value
    ledgers = list(streams.iter_ledgers(client.store, record))
    assert len(ledgers) < ledgers_before and len(result.runs) == 2   # the old pair, and the timed ledgers
    metas = [client.ledger_metadata(ledger.ledger_id) for ledger in ledgers]
    assert TIME_KEY not in metas[0].custom
    assert LedgerTimes.of(metas[1]) == LedgerTimes(start, start + 170)   # every timed ledger but the last
    assert first_offset_at_or_after(client, record, start + 95) == 4 + 10


def dangling_raw_stream(metadata_uri: str, name: str) -> None:
    """Entries 0..4 at BASE..BASE+4, acknowledged; the writer dies: its ledger stays OPEN, the nodes' LAC at 3."""
    writer_client = LedgerClient(metadata_uri)
    writer = Streams(writer_client).open_writer(name, clock=scripted_clock([BASE + n for n in range(5)]))
    for n in range(5):
        writer.append(f"e{n}".encode())
    ledger_id = writer.ledger_id
    writer_client.close()
    with LedgerClient(metadata_uri) as lc:
        poll_until(lambda: lc.is_dangling(lc.ledger_metadata(ledger_id)), 30, what="the writer's registration to go")
        assert lc.open_ledger(ledger_id, recover=False).last_entry_id < 4


def read_offsets(metadata_uri: str, name: str, **options) -> list[int]:
    opts = LedgerOptions.parse({"metadata": metadata_uri, "path": name, "includemetadata": "true", **options})
    reader = LedgerReader(opts, raw_read_schema(True), raw=True)
    return [offset for p in reader.partitions() for batch in reader.read(p) for offset in batch.column("_offset")
            .to_pylist()]


@pytest.mark.parametrize("bound, expected", [("endingtimestamp", [0, 1, 2, 3]), ("startingtimestamp", [4])])
def test_a_time_bound_on_a_dangling_tail_is_found_after_its_recovery(metadata_uri, cluster, bound, expected):
    """Spark read audit 2026-11-29: the time search read the dangling tail up to the nodes' LAC, then planning
    recovered it further (the last add's LAC goes out with the next add): endingTimestamp=BASE+4 read entry 4,
    appended at that (exclusive) time, and startingTimestamp=BASE+4 failed saying every row was appended before
    it. The tail is recovered before the search."""
    cluster(3)
    dangling_raw_stream(metadata_uri, "s")
    assert read_offsets(metadata_uri, "s", **{bound: str(BASE + 4)}) == expected


def test_a_streaming_query_started_at_a_time_on_a_dangling_tail_starts_at_its_last_entry(metadata_uri, cluster):
    """Review 2026-11-29: the streaming source searched startingTimestamp before it recovered the dangling tail,
    so it saw the tail only up to the nodes' LAC: with strategy latest the query started past entry 4 (appended
    at that time) and never read it; with error it failed saying every row was before the time."""
    cluster(3)
    dangling_raw_stream(metadata_uri, "s")
    opts, stream_opts = StreamOptions.parse({"metadata": metadata_uri, "path": "s",
                                             "startingTimestamp": str(BASE + 4)})
    reader = LedgerStreamReader(opts, stream_opts, raw_read_schema(False), raw=True)
    try:
        assert json.loads(json.dumps(reader.initialOffset()))["offset"] == 4
    finally:
        reader.stop()
