"""Entry times (issue 16 item 1): the framing (connector/client/entry_time.py), the writer's clock, the binary
searches of a time search (connector/client/time_search.py), the options that take times and the pruning of
partitions by _timestamp filters (planning.py). Pure: no I/O."""
import datetime
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, LessThanOrEqual

from connector.client import entry_time
from connector.client.ops.read import Entry
from connector.client.time_search import first_true, search
from connector.spark.errors import InvalidOptionError
from connector.spark.options import LedgerOptions
from connector.spark.planning import LedgerSpan, ReadBounds, plan_partitions
from connector.spark.schema import raw_read_schema
from connector.spark.stream_options import StreamOptions
from connector.spark.stream_read import LedgerStreamReader
from metadata.model import Fragment, LedgerMetadata, LedgerState

URI = "zk://127.0.0.1:2181/ledgers"


def ledger(custom: dict, closed: bool = True, last_entry_id: int = 3) -> LedgerMetadata:
    return LedgerMetadata(7, 3, 3, 2, (Fragment(0, ("a", "b", "c")),),
                          state=LedgerState.CLOSED if closed else LedgerState.OPEN, last_entry_id=last_entry_id,
                          custom_metadata=tuple(sorted((k, str(v)) for k, v in custom.items())))


# -- framing ------------------------------------------------------------------------------------------------


@given(st.integers(0, 2**63), st.binary(max_size=64))
def test_a_framed_payload_splits_back_into_its_time_and_payload(time_ms, payload):
    assert entry_time.split(entry_time.frame(time_ms, payload)) == (time_ms, payload)


def test_entries_of_a_marked_ledger_are_read_without_their_frame_and_with_their_time():
    meta = ledger(entry_time.marked({"stream": "s"}))
    stored = [Entry(0, entry_time.frame(1_700_000_000_123, b"a")), Entry(1, entry_time.frame(1_700_000_000_124, b""))]
    read = list(entry_time.stripped(meta, stored))
    assert [(e.entry_id, e.payload, e.time_ms) for e in read] == [(0, b"a", 1_700_000_000_123), (1, b"", 1_700_000_000_124)]
    assert all(isinstance(e, Entry) for e in read)


def test_payloads_received_as_views_are_bytes_unless_the_reader_takes_views():
    framed = memoryview(b"head" + entry_time.frame(1_700_000_000_123, b"payload"))[4:]
    for meta in (ledger(entry_time.marked()), ledger({})):
        expected = b"payload" if entry_time.TIME_KEY in meta.custom else bytes(framed)
        as_bytes, = entry_time.stripped(meta, [Entry(0, framed)])
        as_view, = entry_time.stripped(meta, [Entry(0, framed)], views=True)
        assert type(as_bytes.payload) is bytes and as_bytes.payload == expected
        assert isinstance(as_view.payload, memoryview) and as_view.payload.obj is framed.obj
        assert bytes(as_view.payload) == expected


def test_entries_of_a_ledger_written_before_times_read_exactly_as_stored():
    meta = ledger({"stream": "s"})
    stored = [Entry(0, b"LDA1 and more"), Entry(1, b"")]
    assert [(e.entry_id, e.payload, e.time_ms) for e in entry_time.stripped(meta, stored)] == [
        (0, b"LDA1 and more", None), (1, b"", None)]


def test_a_marked_ledger_whose_entry_is_too_short_for_a_time_is_an_error_not_a_misread():
    with pytest.raises(entry_time.EntryTimeFormatError, match="entry 3 of ledger 7 holds 5 bytes"):
        list(entry_time.stripped(ledger(entry_time.marked()), [Entry(3, b"short")]))


def test_a_later_format_of_times_is_refused_with_a_clear_error():
    with pytest.raises(entry_time.EntryTimeFormatError, match="format '2'.*reads format 1"):
        entry_time.carries_times(ledger({entry_time.TIME_KEY: "2"}))


# -- the writer's clock and the times recorded at close ---------------------------------------------------


def test_the_clock_never_goes_back_when_the_host_clock_steps_back():
    readings = iter([100.0, 100.5, 99.0, 99.9, 101.0])
    clock = entry_time.AppendClock(now=lambda: next(readings))
    assert [clock.now() for _ in range(5)] == [100_000, 100_500, 100_500, 100_500, 101_000]


def test_a_takeover_floor_holds_the_clock_at_the_previous_owners_last_time():
    clock = entry_time.AppendClock(now=lambda: 5.0)
    clock.advance_to(9_000)
    clock.advance_to(None)
    assert clock.now() == 9_000


def test_a_ledger_records_its_first_and_last_time_and_an_empty_one_its_close_time():
    readings = iter([1.0, 2.0, 3.0])
    clock = entry_time.AppendClock(now=lambda: next(readings))
    times = entry_time.Stamper(clock)
    times.stamp(b"x")
    times.stamp(b"y")
    assert times.close_metadata() == {entry_time.FIRST_KEY: 1000, entry_time.LAST_KEY: 2000}
    assert entry_time.Stamper(clock).close_metadata() == {entry_time.LAST_KEY: 3000}


def test_copied_times_are_kept_as_they_were_and_bound_the_ledger():
    times = entry_time.Stamper(entry_time.AppendClock(now=lambda: 0.0))
    framed = [times.stamp(b"", t) for t in (9, 5, 12, 7)]
    assert [entry_time.split(f)[0] for f in framed] == [9, 5, 12, 7]
    assert times.close_metadata() == {entry_time.FIRST_KEY: 5, entry_time.LAST_KEY: 12}


def test_recorded_times_are_read_only_from_a_closed_marked_ledger():
    recorded = entry_time.marked({entry_time.FIRST_KEY: 10, entry_time.LAST_KEY: 20})
    assert entry_time.LedgerTimes.of(ledger(recorded)) == entry_time.LedgerTimes(10, 20)
    assert entry_time.LedgerTimes.of(ledger(recorded, closed=False)) is None
    assert entry_time.LedgerTimes.of(ledger(entry_time.marked())) is None          # closed by a recovery
    assert entry_time.LedgerTimes.of(ledger({entry_time.LAST_KEY: 20})) is None    # not marked: ignored
    assert entry_time.LedgerTimes.of(ledger(entry_time.marked({entry_time.LAST_KEY: 5}))) == entry_time.LedgerTimes(None, 5)


# -- the binary searches ------------------------------------------------------------------------------------


@given(st.lists(st.booleans()).map(sorted))
def test_first_true_finds_where_a_monotone_predicate_turns_true(values):
    calls = []

    def reaches(i):
        calls.append(i)
        return values[i]

    assert first_true(0, len(values), reaches) == (values.index(True) if True in values else len(values))
    assert len(calls) <= math.ceil(math.log2(len(values) + 1))


@st.composite
def streams_of_times(draw):
    """Ledgers of non-decreasing entry times (equal times within and across ledgers, empty ledgers, which reach
    any time), cut into pages and a tail; maybe an OPEN last ledger."""
    steps = draw(st.lists(st.integers(0, 3), min_size=0, max_size=120))
    times = []
    now = draw(st.integers(0, 50))
    for step in steps:
        now += step
        times.append(now)
    sizes = []
    left = len(times)
    while left > 0 or not sizes:
        size = draw(st.integers(0, min(left, 6)))
        sizes.append(size)
        left -= size
    ledgers, at = [], 0
    for size in sizes:
        entries = times[at:at + size]
        at += size
        ledgers.append({"first_offset": at - size, "times": entries})
    previous = 0
    for i, one in enumerate(ledgers):
        following = next((l["times"][0] for l in ledgers[i + 1:] if l["times"]), previous + 5)
        # a ledger without entries reaches any time (time_search.LedgerProbe.last_time): it holds no offset
        one["last"] = one["times"][-1] if one["times"] else math.inf
        previous = one["last"] if one["times"] else previous
    open_tail = draw(st.booleans())
    page = draw(st.integers(1, 8))
    tail_length = draw(st.integers(1, len(ledgers)))
    paged = ledgers[:len(ledgers) - tail_length]
    blocks = [tuple(range(i, min(i + page, len(paged)))) for i in range(0, len(paged), page)]
    blocks.append(tuple(range(len(paged), len(ledgers))))
    target = draw(st.integers(-1, (times[-1] if times else 0) + 2))
    return ledgers, blocks, open_tail, target


@settings(max_examples=400, deadline=None)
@given(streams_of_times())
def test_the_two_level_search_finds_the_first_offset_at_or_after_a_time(case):
    ledgers, blocks, open_tail, target = case
    last = len(ledgers) - 1
    reached, searched = [], []

    def reaching(i):
        return (open_tail and i == last) or ledgers[i]["last"] >= target

    def reaches(i):
        reached.append(i)
        return reaching(i)

    def entry_at_or_after(i):
        entries = ledgers[i]["times"]
        entry = first_true(0, len(entries), lambda e: entries[e] >= target)
        return ledgers[i]["first_offset"] + entry if entry < len(entries) else None

    def offset_in(i):
        searched.append(i)
        return entry_at_or_after(i)

    all_times = [t for one in ledgers for t in one["times"]]
    expected = next((offset for offset, t in enumerate(all_times) if t >= target), None)
    assert search(len(blocks), lambda b: blocks[b], reaches, offset_in) == expected
    # O(log) ledgers probed per ledger found without an offset (an empty one, or the OPEN tail); entries searched
    # only in ledgers reaching the time, and in none that holds an entry at or after it but the last
    largest = max(len(b) for b in blocks)
    rounds = 1 + len([i for i in searched[:-1] if entry_at_or_after(i) is None])
    assert len(set(reached)) <= rounds * (math.ceil(math.log2(len(blocks) + 1)) + math.ceil(math.log2(largest + 1)) + 2)
    assert all(reaching(i) for i in searched)
    assert all(entry_at_or_after(i) is None for i in searched[:-1])
    assert all(not ledgers[i]["times"] or (open_tail and i == last) for i in searched[:-1])   # only empties skipped


# -- options ------------------------------------------------------------------------------------------------


def parse(**options):
    return LedgerOptions.parse({"metadata": URI, "path": "s", **{k.lower(): str(v) for k, v in options.items()}})


def test_time_options_are_parsed_in_milliseconds_with_kafkas_default_strategy():
    opts = parse(startingTimestamp=1_700_000_000_000, endingTimestamp=1_700_000_000_500)
    assert (opts.starting_timestamp, opts.ending_timestamp, opts.timestamp_strategy) == (
        1_700_000_000_000, 1_700_000_000_500, "error")
    assert parse(startingTimestamp=0, startingOffsetsByTimestampStrategy="LATEST").timestamp_strategy == "latest"


@pytest.mark.parametrize("options, message", [
    ({"startingTimestamp": "yesterday"}, r"startingTimestamp='yesterday': allowed values are times in milliseconds"),
    ({"endingTimestamp": "-5"}, r"endingTimestamp='-5': allowed values are times in milliseconds"),
    ({"startingTimestamp": "1700000000020", "endingTimestamp": "1700000000010"},
     r"endingTimestamp=1700000000010 is before startingTimestamp=1700000000020"),
    ({"startingTimestamp": "0", "startingOffsets": "earliest"},
     r"both startingOffsets='earliest' and startingTimestamp"),
    ({"endingTimestamp": "0", "endingOffsets": "5"}, r"both endingOffsets and endingTimestamp"),
    ({"startingTimestamp": "1700000000"}, r"startingTimestamp='1700000000' looks like seconds \(as milliseconds it is "
                                          r"before 1973-03-03, before any append\); startingTimestamp takes "
                                          r"milliseconds since the epoch: startingTimestamp=1700000000000"),
    ({"endingTimestamp": str(10 ** 11 - 1)}, r"endingTimestamp='99999999999' looks like seconds"),
    ({"startingOffsetsByTimestampStrategy": "earliest"}, r"allowed values are error, latest"),
    # past year 9999: an audit's read failed with OverflowError / ValueError from the date in an error message
    ({"startingTimestamp": "9000000000000000"}, r"startingTimestamp='9000000000000000': allowed values are times in "
                                                r"milliseconds since the epoch \(an integer >= 0, up to "
                                                r"253402300799999: 9999-12-31 23:59:59.999 UTC\)"),
    ({"endingTimestamp": str(1 << 80)}, r"endingTimestamp='1208925819614629174706176': allowed values are"),
])
def test_bad_time_options_are_refused_with_a_clear_error(options, message):
    with pytest.raises(InvalidOptionError, match=message):
        parse(**options)


def test_times_are_refused_with_the_ledgers_option_and_on_writes():
    with pytest.raises(InvalidOptionError, match="cannot be used with the ledgers option"):
        LedgerOptions.parse({"metadata": URI, "ledgers": "1,2", "startingtimestamp": "0"})
    with pytest.raises(InvalidOptionError, match="for reading; remove them from the write"):
        parse(startingTimestamp=0).check_writable()


def test_a_streaming_read_takes_one_start_and_no_ending_timestamp():
    with pytest.raises(InvalidOptionError, match="both startingOffsets='latest' and startingTimestamp='0'"):
        StreamOptions.parse({"metadata": URI, "path": "s", "startingOffsets": "latest", "startingTimestamp": "0"})
    with pytest.raises(InvalidOptionError, match="startingTimestamp='1700000000' looks like seconds"):
        StreamOptions.parse({"metadata": URI, "path": "s", "startingTimestamp": "1700000000"})
    opts, stream_opts = StreamOptions.parse({"metadata": URI, "path": "s", "startingTimestamp": "1700000000005",
                                             "endingTimestamp": "1700000000009"})
    assert opts.starting_timestamp == 1_700_000_000_005
    with pytest.raises(InvalidOptionError, match="endingTimestamp is for batch reads"):
        LedgerStreamReader(opts, stream_opts, raw_read_schema(True), raw=True)


# -- pruning by _timestamp filters -------------------------------------------------------------------------


def at(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)


SPANS = [
    LedgerSpan(1, 9, 0, 9, time_range=(1_000, 1_999)),
    LedgerSpan(2, 9, 10, 19, time_range=(2_000, 2_999)),
    LedgerSpan(3, 9, 20, 29, untimed=True),                 # written before entry times: _timestamp is null
    LedgerSpan(4, 9, 30, 39),                               # closed by a recovery: times unknown
    LedgerSpan(5, 9, 40, 49, time_range=(5_000, 5_999)),
]


def planned_ledgers(*filters) -> list[int]:
    bounds = ReadBounds()
    for flt in filters:
        bounds = bounds.pushed("times", flt) or bounds
    return [p.ledger_id for p in plan_partitions(SPANS, bounds, 0, offset_per_entry=True)]


@pytest.mark.parametrize("filters, ledgers", [
    ((), [1, 2, 3, 4, 5]),
    ((GreaterThan(("_timestamp",), at(2_999)),), [4, 5]),
    ((GreaterThanOrEqual(("_timestamp",), at(2_999)),), [2, 4, 5]),
    ((LessThan(("_timestamp",), at(2_000)),), [1, 4]),
    ((LessThanOrEqual(("_timestamp",), at(2_000)),), [1, 2, 4]),
    ((EqualTo(("_timestamp",), at(5_500)),), [4, 5]),
    ((GreaterThanOrEqual(("_timestamp",), at(1_500)), LessThanOrEqual(("_timestamp",), at(2_500))), [1, 2, 4]),
    ((In(("_timestamp",), (at(1_000), at(1_001))),), [1, 4]),
])
def test_timestamp_filters_prune_ledgers_by_their_recorded_times(filters, ledgers):
    assert planned_ledgers(*filters) == ledgers


def test_a_filter_value_that_is_not_a_timestamp_does_not_prune():
    assert ReadBounds().pushed("times", GreaterThan(("_timestamp",), "soon")) is None


def test_a_time_past_year_9999_in_an_error_is_said_not_raised():
    """The date in NoOffsetForTimeError's message raised OverflowError / ValueError past year 9999 (an audit's)."""
    from connector.client.time_search import NoOffsetForTimeError
    from connector.spark.read import no_offset_at

    for time_ms in (9 * 10 ** 15, 1 << 80):
        with pytest.raises(NoOffsetForTimeError, match=f"startingTimestamp={time_ms} \\(a time past year 9999\\)"):
            no_offset_at("s", time_ms, "error")
