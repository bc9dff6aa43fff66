"""failOnDataLoss (connector/spark/data_loss.py) for reads that a truncation overtakes, against a real ZooKeeper and
real nodes: a batch read or a micro-batch planned before the cut whose executor then finds its ledger deleted, and
a plan during which the cut deletes a page it was about to read. With failOnDataLoss=true the read fails naming the
first offset the stream still holds; with false it skips the lost offsets and reads the rest.

The readers are the data source's own, driven as Spark drives them (plan on the driver, read() per partition),
without a SparkSession; tests/spark/test_stream_truncation.py runs the same through Spark.
"""
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from connector.client import LedgerClient, Streams
from connector.retention import truncate_stream
from connector.spark.errors import DataLossError
from connector.spark.options import LedgerOptions
from connector.spark.planning import pieces_of
from connector.spark.read import LedgerReader
from connector.spark.schema import raw_read_schema
from connector.spark.stream_options import StreamOptions
from connector.spark.stream_read import LedgerStreamReader
from metadata import streams
from tests.harness.stream_fixtures import appended, closed_ledgers

SCHEMA = raw_read_schema(include_metadata=True)


def write_raw_stream(uri: str, name: str, ledgers: int, entries: int) -> None:
    with LedgerClient(uri) as client, Streams(client).open_writer(name, max_ledger_entries=entries) as writer:
        for i in range(ledgers * entries):
            writer.append(f"e{i:03d}".encode())


def planned_ledgers(partitions) -> list[int]:
    """The ledger ids partitions() planned, in order, whether packed into LedgerRuns or one per partition."""
    return [piece.ledger_id for p in partitions for piece in pieces_of(p)]


def offsets_read(reader, partitions) -> list[int]:
    return [offset for p in partitions for batch in reader.read(p) for offset in batch.column("_offset").to_pylist()]


def batch_reader(uri: str, fail: bool, **options) -> LedgerReader:
    opts = LedgerOptions.parse({"metadata": uri, "path": "events", "failOnDataLoss": str(fail).lower(), **options})
    return LedgerReader(opts, SCHEMA, raw=True)


def stream_reader(uri: str, fail: bool) -> LedgerStreamReader:
    opts, stream_opts = StreamOptions.parse({"metadata": uri, "path": "events", "failOnDataLoss": str(fail).lower()})
    return LedgerStreamReader(opts, stream_opts, SCHEMA, raw=True)


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("fail", [True, False])
def test_a_batch_read_planned_before_a_truncation_finds_its_ledgers_gone(cluster, metadata_uri, fail, packed):
    cluster(3)
    write_raw_stream(metadata_uri, "events", ledgers=3, entries=4)   # offsets 0..11 in 3 ledgers
    reader = batch_reader(metadata_uri, fail, **({} if packed else {"maxPartitionBytes": "0"}))
    partitions = reader.partitions()
    assert len(planned_ledgers(partitions)) == 3
    assert len(partitions) == (1 if packed else 3)   # three small ledgers: one Spark task reads them all
    with LedgerClient(metadata_uri) as lc:
        truncate_stream(lc, "events", 8)   # the first two ledgers are deleted after the plan
    if fail:
        with pytest.raises(DataLossError, match=r"the ledger holding offsets from 0 was deleted after this read "
                                                r"was planned .* the first offset the stream still holds is 8"):
            offsets_read(reader, partitions)
    else:
        assert offsets_read(reader, partitions) == [8, 9, 10, 11]


@pytest.mark.parametrize("fail", [True, False])
def test_a_micro_batch_planned_before_a_truncation_finds_its_ledgers_gone(cluster, metadata_uri, fail):
    cluster(3)
    write_raw_stream(metadata_uri, "events", ledgers=3, entries=4)
    reader = stream_reader(metadata_uri, fail)
    end = reader.latestOffset({"offset": 2}, ReadAllAvailable())
    partitions = reader.partitions({"offset": 2}, end)
    with LedgerClient(metadata_uri) as lc:
        truncate_stream(lc, "events", 4)
    if fail:
        with pytest.raises(DataLossError, match="the first offset the stream still holds is 4"):
            offsets_read(reader, partitions)
    else:
        assert offsets_read(reader, partitions) == list(range(4, 12))


@pytest.mark.parametrize("fail", [True, False])
def test_a_plan_that_a_truncation_overtakes_is_data_loss_for_the_offsets_it_asked_for(
        metadata_uri, monkeypatch, fail):
    """The cut lands while the driver lists the stream's pages: the page it reads next is gone."""
    with LedgerClient(metadata_uri) as lc:
        ids = closed_ledgers(lc.store, 600)   # offsets 0..5999, 10 per ledger, two pages and a tail
        appended(lc.store, "events", ids)
        read_page = streams.read_page
        cut = []

        def racing(store, name, page):
            if not cut:
                cut.append("cutting")   # the truncation reads pages too
                cut[0] = truncate_stream(lc, "events", 3000)
            return read_page(store, name, page)

        monkeypatch.setattr(streams, "read_page", racing)
        reader = batch_reader(metadata_uri, fail, startingOffsets="100", recover="false")
        if fail:
            with pytest.raises(DataLossError, match=r"offsets 100\.\.2999 left the stream while this read was "
                                                    r"planned .* the first offset the stream still holds is 3000"):
                reader.partitions()
        else:
            assert planned_ledgers(reader.partitions()) == ids[300:]
        assert cut[0].first_offset == 3000


@pytest.mark.parametrize("fail", [True, False])
def test_a_batch_read_from_offsets_below_the_first_one_is_data_loss(metadata_uri, fail):
    with LedgerClient(metadata_uri) as lc:
        ids = closed_ledgers(lc.store, 5)
        appended(lc.store, "events", ids)
        truncate_stream(lc, "events", 25)
    reader = batch_reader(metadata_uri, fail, startingOffsets="5", recover="false")
    if fail:
        with pytest.raises(DataLossError, match=r"offsets 5\.\.19 are gone .* the first offset the stream still "
                                                r"holds is 20; set failOnDataLoss=false to skip them"):
            reader.partitions()
    else:
        assert planned_ledgers(reader.partitions()) == ids[2:]
    assert planned_ledgers(batch_reader(metadata_uri, True, recover="false").partitions()) == ids[2:]


def delete_events(uri: str) -> None:
    """`ledger stream delete events --yes`: the stream, then its ledgers."""
    from connector.cli import main
    assert main(["stream", "delete", "events", "--yes", "--metadata", uri]) == 0


@pytest.mark.parametrize("fail", [True, False])
def test_a_micro_batch_whose_stream_is_deleted_before_it_is_planned_is_data_loss(cluster, metadata_uri, fail):
    """Stream audit 2026-11-29: latestOffset promised offsets, and the stream was deleted before partitions() planned
    them (or before the batch was replayed after a restart): NoSuchStreamError failed the query with
    failOnDataLoss=false too, and every restart replayed the batch and failed again until a stream of the name
    existed. The offsets are gone with the stream: data loss, skipped with failOnDataLoss=false."""
    cluster(3)
    write_raw_stream(metadata_uri, "events", ledgers=2, entries=4)
    reader = stream_reader(metadata_uri, fail)
    end = reader.latestOffset({"offset": 0}, ReadAllAvailable())
    delete_events(metadata_uri)
    if fail:
        with pytest.raises(DataLossError, match=r"stream 'events' was deleted after this micro-batch was planned: "
                                                r"its offsets 0\.\.7 are gone"):
            reader.partitions({"offset": 0}, end)
    else:
        assert reader.partitions({"offset": 0}, end) == []


@pytest.mark.parametrize("fail", [True, False])
def test_a_read_whose_stream_is_deleted_after_it_was_planned_is_data_loss(cluster, metadata_uri, fail):
    """The executor's side: the ledger a partition planned is gone, and so is its stream (read_or_lost read the
    stream's head and failed with NoSuchStreamError whatever failOnDataLoss said)."""
    cluster(3)
    write_raw_stream(metadata_uri, "events", ledgers=2, entries=4)
    reader = stream_reader(metadata_uri, fail)
    end = reader.latestOffset({"offset": 0}, ReadAllAvailable())
    partitions = reader.partitions({"offset": 0}, end)
    delete_events(metadata_uri)
    if fail:
        with pytest.raises(DataLossError, match=r"the ledger holding offsets from 0 was deleted with the stream"):
            offsets_read(reader, partitions)
    else:
        assert offsets_read(reader, partitions) == []
