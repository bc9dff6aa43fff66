"""Issue 13 item 1 (DESIGN rule 17): a streaming micro-batch reads exactly the range its latestOffset promised,
even when the nodes' LACs differ and a second LAC read would answer less than the first.

The stream: a sealed raw ledger (offsets 0..99) and the OPEN ledger of a live writer (offsets 100..399) whose
300 entries every node holds, but only node 1 knows LAC 299; nodes 2 and 3 know LAC -1 (the writer's pipelined
adds all piggybacked -1). latestOffset asks nodes 1 and 2 (node 3 paused) and promises offset 400; then node 1
pauses, so any LAC read answers -1, and partitions() must still plan, and executors read, every promised row.
"""
import contextlib

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from connector.client import LedgerClient
from connector.spark.errors import DataLossError
from connector.spark.schema import raw_read_schema
from connector.spark.stream_options import StreamOptions
from connector.spark.stream_read import LedgerStreamReader
from metadata import registry
from metadata.model import Fragment, LedgerMetadata, LedgerState, StreamLedger, StreamRecord
from metadata.streams import create_stream
from tests.harness.node_client import NodeClient, open_ledger_on_nodes, payload_for
from tests.harness.stream_fixtures import without_created

PASSWORD = b"test-password"
SEALED = 100    # entries (= offsets) of the sealed ledger
TAIL = 300      # entries of the OPEN ledger
WRITER = "writer-promised-range-test"


def sealed_ledger(metadata_uri) -> int:
    with LedgerClient(metadata_uri) as lc, lc.create_ledger(3, 3, 2, password=PASSWORD) as handle:
        for future in [handle.append_async(b"sealed %d" % e) for e in range(SEALED)]:
            future.result()
        return handle.ledger_id


def open_tail_known_to_one_node(store, nodes) -> int:
    """The OPEN ledger of a live writer: every node holds its entries, only nodes[0] knows they are confirmed."""
    ledger_id = open_ledger_on_nodes(store, nodes, TAIL, PASSWORD, WRITER, lacs=(TAIL - 1,))
    for node, lac in zip(nodes, (TAIL - 1, -1, -1)):
        with NodeClient(node.address) as nc:
            assert nc.read_lac(ledger_id).last_add_confirmed == lac
    return ledger_id


def sealed_and_open_tail(cluster, store, metadata_uri):
    """The stream of the module docstring, its tail's writer registered (alive: nobody recovers the tail): (nodes, the
    writer's registration, the sealed ledger, the OPEN one, a function making a source that reads the stream)."""
    nodes = cluster(3)
    writer = registry.register_writer(store, WRITER)
    sealed = sealed_ledger(metadata_uri)
    tail = open_tail_known_to_one_node(store, nodes)
    create_stream(store, StreamRecord("events", format="raw", tail=(
        StreamLedger(sealed, 0, SEALED - 1), StreamLedger(tail, SEALED))))
    options, stream_options = StreamOptions.parse(
        {"metadata": metadata_uri, "path": "events", "password": PASSWORD.decode()})

    def reader() -> LedgerStreamReader:
        return LedgerStreamReader(options, stream_options, raw_read_schema(include_metadata=True), raw=True)

    return nodes, writer, sealed, tail, reader


def end_from_nodes_1_and_2(nodes, reader: LedgerStreamReader, start: dict | None = None) -> dict:
    """latestOffset while node 3 is paused: nodes 1 and 2 answer, LAC 299, so the end announced is offset 400."""
    nodes[2].pause()
    try:
        return reader.latestOffset(start or {"offset": 50}, ReadAllAvailable())
    finally:
        nodes[2].resume()


@contextlib.contextmanager
def left_as_found(nodes, writer, *readers: LedgerStreamReader):
    """Every node resumed, the readers stopped and the tail's writer gone at the end."""
    try:
        yield
    finally:
        for node in nodes:
            node.resume()
        for reader in readers:
            reader.stop()
        writer.close()


def test_a_micro_batch_reads_every_promised_row_when_a_second_lac_read_would_answer_less(cluster, store,
                                                                                         metadata_uri):
    nodes, writer, sealed, tail, new_reader = sealed_and_open_tail(cluster, store, metadata_uri)
    reader = new_reader()
    start = {"offset": 50}
    try:
        nodes[2].pause()
        end = reader.latestOffset(start, ReadAllAvailable())   # nodes 1 and 2 answer: LAC 299
        nodes[2].resume()
        assert without_created(end) == {"offset": SEALED + TAIL, "stream": "events"}

        nodes[0].pause()                                       # from now on nodes 2 and 3 answer: LAC -1
        partitions = reader.partitions(start, end)
        planned = [(p.ledger_id, p.first_entry, p.last_entry) for p in partitions]
        assert planned == [(sealed, 50, SEALED - 1), (tail, 0, TAIL - 1)]

        rows = pa.Table.from_batches([b for p in partitions for b in reader.read(p)]).to_pylist()
    finally:
        for node in nodes:
            node.resume()
        writer.close()
    assert [r["_offset"] for r in rows] == list(range(start["offset"], end["offset"]))
    assert [(r["ledger_id"], r["entry_id"]) for r in rows] == (
        [(sealed, e) for e in range(50, SEALED)] + [(tail, e) for e in range(TAIL)])
    assert [r["payload"] for r in rows] == (
        [b"sealed %d" % e for e in range(50, SEALED)] + [payload_for(tail, e) for e in range(TAIL)])


@pytest.mark.parametrize("fail", [True, False])
def test_promised_offsets_the_stream_no_longer_holds_are_data_loss_not_a_shorter_batch(store, metadata_uri, fail):
    create_stream(store, StreamRecord("events", format="raw", tail=(StreamLedger(7, 0, 99),)))
    options, stream_options = StreamOptions.parse({"metadata": metadata_uri, "path": "events",
                                                   "failondataloss": str(fail).lower()})
    reader = LedgerStreamReader(options, stream_options, raw_read_schema(include_metadata=True), raw=True)
    if fail:
        with pytest.raises(DataLossError, match=r"offsets 100\.\.149, promised to this micro-batch"):
            reader.partitions({"offset": 50}, {"offset": 150})
    else:
        assert [(p.first_entry, p.last_entry, p.lo, p.hi) for p in reader.partitions({"offset": 50}, {"offset": 150})] \
            == [(50, 99, 50, 99)]


@pytest.mark.parametrize("fail", [True, False])
def test_a_stream_that_ends_below_the_querys_offset_is_data_loss(store, metadata_uri, fail):
    """Issue 13 finding 4: offsets only grow; a stream whose end fell below where a query stands (a record
    written by a version that reset offsets on an empty overwrite) is reported, not silently re-read."""
    closed = LedgerMetadata(0, 3, 3, 2, (Fragment(0, ("a", "b", "c")),), state=LedgerState.CLOSED,
                            last_entry_id=49, length=50)
    ledger_id = store.create_ledger(closed).value.ledger_id
    create_stream(store, StreamRecord("events", format="raw", tail=(StreamLedger(ledger_id, 0, 49),)))
    options, stream_options = StreamOptions.parse({"metadata": metadata_uri, "path": "events",
                                                   "failondataloss": str(fail).lower()})
    reader = LedgerStreamReader(options, stream_options, raw_read_schema(include_metadata=True), raw=True)
    if fail:
        with pytest.raises(DataLossError, match="now ends at offset 50, below offset 100"):
            reader.latestOffset({"offset": 100}, ReadAllAvailable())
    else:
        offset = reader.latestOffset({"offset": 100}, ReadAllAvailable())
        assert without_created(offset) == {"offset": 100, "stream": "events"}


def test_an_emptied_stream_starts_where_its_offsets_left_off(store, metadata_uri):
    create_stream(store, StreamRecord("events", format="raw", first_offset=100))
    options, stream_options = StreamOptions.parse({"metadata": metadata_uri, "path": "events"})
    reader = LedgerStreamReader(options, stream_options, raw_read_schema(include_metadata=True), raw=True)
    assert without_created(reader.initialOffset()) == {"offset": 100, "stream": "events"}
    offset = reader.latestOffset({"offset": 100}, ReadAllAvailable())
    assert without_created(offset) == {"offset": 100, "stream": "events"}


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_query_whose_stream_was_deleted_and_created_again_does_not_skip_its_rows_silently(
        cluster, store, metadata_uri, fail_on_data_loss):
    """Helper audit 2026-11-29: a stream deleted and created again under the same name starts its offsets again at 0.
    A query whose checkpoint held offset k of the old stream went on from k in the new one, skipping offsets 0..k-1
    without a word once the new stream had passed k. The offsets now carry the stream's creation time: a mismatch
    is data loss (failOnDataLoss), as Kafka's source reports a partition whose offsets went back."""
    from connector.client import Streams
    from tests.harness.stream_fixtures import delete_head

    cluster(3)
    with LedgerClient(metadata_uri) as lc:
        with Streams(lc).open_writer("events") as writer:
            writer.append_many([b"old %d" % i for i in range(10)])
        options, stream_options = StreamOptions.parse({"metadata": metadata_uri, "path": "events",
                                                       "failOnDataLoss": str(fail_on_data_loss).lower()})

        def reader():
            return LedgerStreamReader(options, stream_options, raw_read_schema(include_metadata=True), raw=True)

        first = reader()
        try:
            start = first.initialOffset()
            end = first.latestOffset(start, ReadAllAvailable())
            assert (start["offset"], end["offset"]) == (0, 10) and end["created"] > 0
        finally:
            first.stop()
        delete_head(store, "events")
        with Streams(lc).open_writer("events") as writer:
            writer.append_many([b"new %d" % i for i in range(25)])
        restarted = reader()   # the query again, from its checkpoint: end is where it stands
        try:
            if fail_on_data_loss:
                with pytest.raises(DataLossError, match="was deleted and created again"):
                    restarted.latestOffset(end, ReadAllAvailable())
                with pytest.raises(DataLossError, match="was deleted and created again"):
                    restarted.partitions(end, {**end, "offset": 20})
            else:   # reported with a warning, as the user asked; the new stream is read from its start
                later = restarted.latestOffset(end, ReadAllAvailable())
                assert later["offset"] == 25 and later["created"] != end["created"]
                assert planned_offsets(restarted, end, later) == (0, 24)
                restarted.latestOffset(later, ReadAllAvailable())
        finally:
            restarted.stop()


def planned_offsets(reader: LedgerStreamReader, start: dict, end: dict) -> tuple[int, int] | None:
    """The first and last offset the micro-batch from start to end reads."""
    from connector.spark.planning import pieces_of

    pieces = [piece for partition in reader.partitions(start, end) for piece in pieces_of(partition)]
    return (min(p.lo for p in pieces), max(p.hi for p in pieces)) if pieces else None


def test_a_query_reads_a_stream_created_again_shorter_than_its_offset_from_its_start(cluster, store, metadata_uri):
    """Helper audit 2026-11-29: with failOnDataLoss=false, a query whose stream was deleted and created again stayed at
    its old offset: it read nothing of the new stream until that passed the old offset, and then only from there,
    skipping every row written meanwhile. It now reads the new stream from its start (Kafka's source goes on from a
    recreated topic's start too). A stream gone (between the delete and the create) is data loss, not a failure of
    the query, with failOnDataLoss=false."""
    from connector.client import Streams
    from tests.harness.stream_fixtures import delete_head

    cluster(3)
    with LedgerClient(metadata_uri) as lc:
        with Streams(lc).open_writer("events") as writer:
            writer.append_many([b"old %d" % i for i in range(10)])
        options, stream_options = StreamOptions.parse({"metadata": metadata_uri, "path": "events",
                                                       "failOnDataLoss": "false"})
        reader = LedgerStreamReader(options, stream_options, raw_read_schema(include_metadata=True), raw=True)
        try:
            end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
            delete_head(store, "events")
            assert reader.latestOffset(end, ReadAllAvailable()) == end   # gone: nothing to read, no failure
            with Streams(lc).open_writer("events") as writer:
                writer.append_many([b"new %d" % i for i in range(5)])
            # Review 2026-11-29: a batch planned on the old stream and replayed after the recreate (a restart)
            # read the new stream's first offsets, which the next batch read again: it reads nothing now.
            assert planned_offsets(reader, {**end, "offset": 0}, end) is None
            later = reader.latestOffset(end, ReadAllAvailable())
            assert later["offset"] == 5 and planned_offsets(reader, end, later) == (0, 4)
            with Streams(lc).open_writer("events") as writer:
                writer.append_many([b"new %d" % i for i in range(5, 15)])
            last = reader.latestOffset(later, ReadAllAvailable())
            assert last["offset"] == 15 and planned_offsets(reader, later, last) == (5, 14)
        finally:
            reader.stop()


def test_a_restarted_query_under_available_now_does_not_take_a_lagging_lac_for_offsets_taken_back(
        cluster, store, metadata_uri):
    """Helper audit 2026-11-29: the end a query last announced can come from one node's LAC (the long poll's); a
    restarted query (or one whose remembered ends were dropped) reads the OPEN tail's LAC at quorum coverage, which
    can answer less. Under Trigger.AvailableNow, which does not wait for the LAC to catch up, that failed the query
    with "offsets were taken back" (failOnDataLoss=true). Offsets of an OPEN ledger only grow: a LAC below where the
    query stands inside it is nothing new yet."""
    nodes, writer, sealed, tail, reader = sealed_and_open_tail(cluster, store, metadata_uri)

    first, restarted = reader(), reader()
    with left_as_found(nodes, writer, first, restarted):
        end = end_from_nodes_1_and_2(nodes, first)
        assert end["offset"] == SEALED + TAIL
        nodes[0].pause()                                               # from now on LAC -1
        restarted.prepareForTriggerAvailableNow()
        assert restarted.latestOffset(end, ReadAllAvailable()) == end


def test_a_starting_offset_past_the_streams_end_is_refused_naming_the_option(store, metadata_uri):
    """Helper audit 2026-11-29: startingOffsets past the stream's end was taken, and the query's first trigger then
    failed with "offsets were taken back ... set failOnDataLoss=false", which names neither the option nor the fix."""
    from connector.spark.errors import InvalidOptionError

    create_stream(store, StreamRecord("events", format="raw", first_offset=100))

    def reader(starting: str) -> LedgerStreamReader:
        options, stream_options = StreamOptions.parse({"metadata": metadata_uri, "path": "events",
                                                       "startingOffsets": starting})
        return LedgerStreamReader(options, stream_options, raw_read_schema(include_metadata=True), raw=True)

    with pytest.raises(InvalidOptionError, match=r"startingOffsets=150 is past the end of stream 'events' \(its next "
                                                 r"offset is 100\): give an offset up to 100, or startingOffsets=latest"):
        reader("150").initialOffset()
    assert without_created(reader("100").initialOffset()) == {"offset": 100, "stream": "events"}


def test_a_lagging_lac_is_nothing_new_only_inside_the_ledger_the_querys_offset_names(cluster, store, metadata_uri):
    """Review 2026-11-29: the rule above (a LAC read below where the query stands inside an OPEN ledger is nothing
    new) also held when the OPEN ledger was another one, starting at or below that offset: that can only be if the
    ledger the query stood in was closed below the end announced from it (a truncation, rule 13), which it hid.
    Offsets inside an OPEN ledger name it, and the rule holds for that ledger only."""
    from metadata.streams import update_stream

    nodes, writer, sealed, tail, new_reader = sealed_and_open_tail(cluster, store, metadata_uri)
    reader = new_reader()
    with left_as_found(nodes, writer, reader):
        end = end_from_nodes_1_and_2(nodes, reader)
        assert end["offset"] == SEALED + TAIL and end["ledger"] == tail
        # The tail taken off and another OPEN ledger put at its first offset: as if the ledger the query stood in had
        # been closed below the end it announced.
        other = open_ledger_on_nodes(store, nodes, 10, PASSWORD, WRITER)
        update_stream(store, "events", lambda r: r.replace(tail=(StreamLedger(sealed, 0, SEALED - 1),
                                                                  StreamLedger(other, SEALED))))
        with pytest.raises(DataLossError, match="offsets were taken back"):
            new_reader().latestOffset(end, ReadAllAvailable())


def test_an_offset_that_differs_only_in_the_ledger_it_names_plans_no_batch(cluster, store, metadata_uri):
    """Review 2 of 2026-11-29: Spark compares offsets as they are. An offset that only gained or lost the OPEN ledger
    it names (one of the previous version, or one from before the writer rolled or closed its ledger) made Spark plan
    an empty micro-batch each time; with nothing new, latestOffset hands back the offset it was given."""
    nodes, writer, sealed, tail, new_reader = sealed_and_open_tail(cluster, store, metadata_uri)
    reader = new_reader()
    with left_as_found(nodes, writer, reader):
        end = end_from_nodes_1_and_2(nodes, reader)
        assert end["ledger"] == tail
        without_ledger = {key: value for key, value in end.items() if key != "ledger"}
        assert reader.latestOffset(without_ledger, ReadAllAvailable()) == without_ledger
        assert reader.latestOffset(end, ReadAllAvailable()) == end
