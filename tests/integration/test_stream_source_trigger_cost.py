"""What the streaming source's driver asks ZooKeeper for on each trigger (issue 17 item 5), and that its shortcut
never leaves a dangling tail unrecovered.

A trigger calls latestOffset and then reportLatestOffset. latestOffset reads the stream's head and the OPEN tail's
metadata, once, and the nodes' LAC; while that LAC moves on, the tail's writer is alive and ZooKeeper is not asked
about it. reportLatestOffset is what latestOffset found, as Kafka's source reports it: no second look.
"""
import collections
import threading
import time

from pyspark.sql.streaming.datasource import ReadAllAvailable

from connector.client import LedgerClient, Streams
from connector.spark import stream_read
from connector.spark.schema import raw_read_schema
from connector.spark.stream_options import StreamOptions
from connector.spark.stream_read import LedgerStreamReader
from metadata import registry
from metadata.model import StreamLedger, StreamRecord
from metadata.streams import create_stream
from protos import ledger_pb2 as pb
from tests.harness.node_client import NodeClient, open_ledger_on_nodes
from tests.harness.poll import poll_until
from tests.harness.stream_fixtures import without_created

PASSWORD = b"test-password"
WRITER = "writer-trigger-cost-test"


def stream_reader(metadata_uri: str, password: bytes = b"") -> LedgerStreamReader:
    options, stream_options = StreamOptions.parse(
        {"metadata": metadata_uri, "path": "events", "password": password.decode()})
    return LedgerStreamReader(options, stream_options, raw_read_schema(include_metadata=True), raw=True)


class ZooKeeperRequests:
    """Counts the reads the reader's driver client sends to the real ZooKeeper, by kind."""

    KINDS = ("get", "exists", "get_children")

    def __init__(self, reader: LedgerStreamReader):
        self.counts: collections.Counter = collections.Counter()
        zk = reader._side().client.store.zk
        for kind in self.KINDS:
            setattr(zk, kind, self._counted(kind, getattr(zk, kind)))

    def _counted(self, kind, call):
        def counted(*args, **kwargs):
            self.counts[kind] += 1
            return call(*args, **kwargs)
        return counted

    def taken(self) -> dict:
        counts, self.counts = dict(self.counts), collections.Counter()
        return counts


def node_lac(node, ledger_id: int) -> int:
    with NodeClient(node.address) as nc:
        return nc.read_lac(ledger_id).last_add_confirmed


def test_a_trigger_reads_the_head_and_the_tail_once_and_reports_without_asking_again(cluster, metadata_uri):
    nodes = cluster(3)
    with LedgerClient(metadata_uri) as lc:
        writer = Streams(lc).open_writer("events")
        reader = stream_reader(metadata_uri)
        try:
            for i in range(5):
                writer.append(b"entry %d" % i)
            poll_until(lambda: reader.latestOffset({"offset": 0}, ReadAllAvailable())["offset"] == 5,
                       what="the nodes to know the writer's LAC")
            requests = ZooKeeperRequests(reader)
            for i in range(5, 8):
                writer.append(b"entry %d" % i)
            poll_until(lambda: all(node_lac(n, writer.ledger_id) == 7 for n in nodes),
                       what="every node to know the writer's new LAC")
            requests.taken()
            # The LAC moved on: the head and the tail's metadata are read, nothing else of ZooKeeper.
            offset = reader.latestOffset({"offset": 5}, ReadAllAvailable())
            assert without_created(offset) == {"offset": 8, "stream": "events"}
            assert requests.taken() == {"get": 2}
            assert without_created(reader.reportLatestOffset()) == {"offset": 8, "stream": "events"}
            assert requests.taken() == {}
        finally:
            reader.stop()
            writer.close()


def publish_lac(nodes, ledger_id: int, lac: int) -> None:
    for node in nodes:
        with NodeClient(node.address) as nc:
            assert nc.write_lac(ledger_id, lac).status == pb.OK


def open_tail_at_lac_4(cluster, store, metadata_uri: str):
    """Three nodes; a live writer's OPEN ledger of ten entries, of which the nodes know entries 0..4 confirmed
    (LAC 4); a raw stream whose tail it is; and a reader of that stream. Returns (nodes, the writer's
    registration, the ledger id, the reader)."""
    nodes = cluster(3)
    writer = registry.register_writer(store, WRITER)
    tail = open_ledger_on_nodes(store, nodes, 10, PASSWORD, WRITER, lacs=(4, 4, 4))
    create_stream(store, StreamRecord("events", format="raw", tail=(StreamLedger(tail, 0),)))
    return nodes, writer, tail, stream_reader(metadata_uri, PASSWORD)


def test_a_writer_gone_after_its_lac_last_moved_is_recovered_on_the_next_trigger(cluster, store, metadata_uri):
    """The source saw the tail OPEN at LAC 4. The writer publishes LAC 7 and is gone before the next trigger: that
    trigger sees the LAC move (so it does not ask whether the writer lives) and promises offsets up to 7; the one
    after sees the LAC stand still, finds the writer gone, recovers the tail and promises all ten entries."""
    nodes, writer, tail, reader = open_tail_at_lac_4(cluster, store, metadata_uri)
    try:
        assert reader.latestOffset({"offset": 0}, ReadAllAvailable())["offset"] == 5
        publish_lac(nodes, tail, 7)
        writer.close()
        assert reader.latestOffset({"offset": 5}, ReadAllAvailable())["offset"] == 8
        assert not store.read_ledger(tail).value.is_closed
        assert reader.latestOffset({"offset": 8}, ReadAllAvailable())["offset"] == 10
        assert store.read_ledger(tail).value.last_entry_id == 9
        assert reader.latestOffset({"offset": 10}, ReadAllAvailable())["offset"] == 10
    finally:
        reader.stop()


def trigger_while_the_lac_moves(reader: LedgerStreamReader, requests: ZooKeeperRequests, nodes, tail: int, lac: int,
                                 at: int) -> dict:
    """latestOffset at offset `at`, with the nodes' LAC published as `lac` while its long poll waits (the caller makes
    TAIL_WAIT_SECONDS long): once the trigger has read the head and the tail's metadata, and asked whether the tail's
    writer lives (its LAC stood still), which comes last before the wait."""
    failures: list[BaseException] = []

    def publish_while_it_waits():
        try:
            poll_until(lambda: requests.counts["exists"] >= 1, what="the trigger to check the tail's writer")
            publish_lac(nodes, tail, lac)
        except BaseException as exc:   # told by the trigger's thread below
            failures.append(exc)

    publisher = threading.Thread(target=publish_while_it_waits)
    publisher.start()
    try:
        return reader.latestOffset({"offset": at}, ReadAllAvailable())
    finally:
        publisher.join(40)
        assert not failures and not publisher.is_alive(), f"publishing the LAC failed: {failures}"


def test_a_caught_up_trigger_ends_at_the_lac_its_long_poll_returns_without_reading_the_stream_again(
        cluster, store, metadata_uri, monkeypatch):
    """The query stands at the tail's end (LAC 4) and latestOffset waits on the nodes' LAC. The writer publishes
    LAC 7 meanwhile: the trigger promises offsets up to 7 from the LAC the wait returned, and they are planned.
    ZooKeeper is read for the head and the tail's metadata and for the tail's writer (its LAC stood still since the
    last trigger), nothing more: the handle that waits takes the metadata just read, and the stream is not read a
    second time."""
    monkeypatch.setattr(stream_read, "TAIL_WAIT_SECONDS", 30.0)   # the LAC is published while it waits
    nodes, _writer, tail, reader = open_tail_at_lac_4(cluster, store, metadata_uri)
    try:
        assert reader.latestOffset({"offset": 0}, ReadAllAvailable())["offset"] == 5
        requests = ZooKeeperRequests(reader)
        started = time.monotonic()
        offset = trigger_while_the_lac_moves(reader, requests, nodes, tail, 7, at=5)
        assert without_created(offset) == {"offset": 8, "stream": "events"}
        assert time.monotonic() - started < 20, "the long poll did not return when the LAC moved"
        assert requests.taken() == {"get": 2, "exists": 1}
        assert without_created(reader.reportLatestOffset()) == {"offset": 8, "stream": "events"}
        planned = reader.partitions({"offset": 5, "stream": "events"}, {"offset": 8, "stream": "events"})
        assert [(p.ledger_id, p.first_entry, p.last_entry) for p in planned] == [(tail, 5, 7)]
    finally:
        reader.stop()


def test_a_writer_gone_after_its_lac_moved_during_a_long_poll_is_recovered_on_the_next_trigger(
        cluster, store, metadata_uri, monkeypatch):
    """As the test before the last, with the LAC moving while a trigger waits: the next trigger sees it stand still,
    finds the writer gone, recovers the tail and promises all ten entries."""
    monkeypatch.setattr(stream_read, "TAIL_WAIT_SECONDS", 30.0)
    nodes, writer, tail, reader = open_tail_at_lac_4(cluster, store, metadata_uri)
    try:
        assert reader.latestOffset({"offset": 0}, ReadAllAvailable())["offset"] == 5
        requests = ZooKeeperRequests(reader)
        assert trigger_while_the_lac_moves(reader, requests, nodes, tail, 7, at=5)["offset"] == 8
        writer.close()
        assert reader.latestOffset({"offset": 8}, ReadAllAvailable())["offset"] == 10
        assert store.read_ledger(tail).value.last_entry_id == 9
    finally:
        reader.stop()


def test_a_trigger_promises_no_less_when_the_nodes_it_asks_know_a_lower_lac_than_the_long_poll_saw(
        cluster, store, metadata_uri, monkeypatch):
    """A long poll returns as soon as one node's LAC passes: here only node-1 learns LAC 7, and the trigger promises
    offsets up to 7. node-1 then pauses, and the next trigger's LAC read is answered by the two others, which know
    LAC 4. What was confirmed stays confirmed (rule 13): that trigger ends at 8 as promised (rule 17), instead of
    failing the query for offsets taken back."""
    monkeypatch.setattr(stream_read, "TAIL_WAIT_SECONDS", 30.0)
    nodes, _writer, tail, reader = open_tail_at_lac_4(cluster, store, metadata_uri)
    try:
        assert reader.latestOffset({"offset": 0}, ReadAllAvailable())["offset"] == 5
        requests = ZooKeeperRequests(reader)
        assert trigger_while_the_lac_moves(reader, requests, nodes[:1], tail, 7, at=5)["offset"] == 8
        monkeypatch.setattr(stream_read, "TAIL_WAIT_SECONDS", 0.5)
        nodes[0].pause()
        try:
            offset = reader.latestOffset({"offset": 8}, ReadAllAvailable())
            assert without_created(offset) == {"offset": 8, "stream": "events"}
        finally:
            nodes[0].resume()
        assert not store.read_ledger(tail).value.is_closed
    finally:
        reader.stop()
