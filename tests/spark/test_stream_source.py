"""The tailing streaming source against a real cluster: live tail, rate limits, data loss handling."""
import json
import re

import pytest

from connector.client import LedgerClient, Streams
from metadata import streams
from tests.harness.poll import poll_until
from tests.harness.stream_fixtures import without_created


def stream_query(spark, uri, stream, table, **options):
    reader = spark.readStream.format("ledger").option("metadata", uri)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(stream).writeStream.format("memory").queryName(table)


def payloads(spark, table):
    return [bytes(r.payload) for r in spark.sql(f"select payload from {table} order by ledger_id, entry_id").collect()]


def test_tailing_query_sees_each_entry_after_it_is_acknowledged(spark, shared_uri, stream):
    with LedgerClient(shared_uri) as lc, Streams(lc).open_writer(stream) as writer:
        writer.append(b"before the query")
        query = stream_query(spark, shared_uri, stream, "tail").trigger(processingTime="200 milliseconds").start()
        try:
            expected = [b"before the query"]
            poll_until(lambda: payloads(spark, "tail") == expected, 60, what="the first entry")
            for i in range(3):
                payload = f"live {i}".encode()
                writer.append(payload)
                expected.append(payload)
                # Visible once acknowledged and the idle writer's explicit LAC reached the nodes.
                poll_until(lambda: payloads(spark, "tail") == expected, 60, what=f"entry {payload!r}")
        finally:
            query.stop()


def write_entries(uri, stream, count, **writer_options):
    with LedgerClient(uri) as lc, Streams(lc).open_writer(stream, **writer_options) as writer:
        return [writer.append(f"e{i:03d}".encode()) for i in range(count)]


def test_rate_limit_caps_every_micro_batch_and_available_now_reads_everything(spark, shared_uri, stream):
    write_entries(shared_uri, stream, 100, max_ledger_entries=40)
    query = stream_query(spark, shared_uri, stream, "limited", maxRecordsPerTrigger="30").trigger(availableNow=True).start()
    assert query.awaitTermination(120)
    rows = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert rows == [30, 30, 30, 10]
    assert payloads(spark, "limited") == [f"e{i:03d}".encode() for i in range(100)]


def test_starting_offsets_latest_skips_what_is_there(spark, shared_uri, stream):
    write_entries(shared_uri, stream, 5)
    query = stream_query(spark, shared_uri, stream, "latest", startingOffsets="latest").trigger(
        processingTime="200 milliseconds").start()
    try:
        poll_until(lambda: query.recentProgress, 60, what="a first micro-batch")
        with LedgerClient(shared_uri) as lc, Streams(lc).open_writer(stream) as writer:
            writer.append(b"new")
        poll_until(lambda: payloads(spark, "latest") == [b"new"], 60, what="only the new entry")
    finally:
        query.stop()


def drop_first_ledger(uri, stream):
    with LedgerClient(uri) as lc:
        truncated = streams.update_stream(
            lc.store, stream, lambda r: r.replace(tail=r.tail[1:], first_offset=r.tail[1].first_offset)).value
        return truncated.first_offset


@pytest.mark.parametrize("fail", [True, False])
def test_fail_on_data_loss(spark, shared_uri, stream, fail):
    write_entries(shared_uri, stream, 10, max_ledger_entries=5)
    first_left = drop_first_ledger(shared_uri, stream)
    table = f"loss_{str(fail).lower()}"
    query = stream_query(spark, shared_uri, stream, table, startingOffsets="0",
                         failOnDataLoss=str(fail).lower()).trigger(availableNow=True).start()
    if fail:
        with pytest.raises(Exception, match="offsets 0..4 are gone"):
            query.awaitTermination(120)
    else:
        assert query.awaitTermination(120)
        assert first_left == 5
        assert payloads(spark, table) == [f"e{i:03d}".encode() for i in range(5, 10)]


def test_byte_limit_caps_micro_batches_and_the_latest_offset_is_reported(spark, shared_uri, stream):
    with LedgerClient(shared_uri) as lc, Streams(lc).open_writer(stream, max_ledger_entries=50) as writer:
        for i in range(100):
            writer.append(bytes([i % 256]) * 92)   # 92 bytes and 8 of append time: 100 bytes per offset
    query = stream_query(spark, shared_uri, stream, "bytes_limited", maxBytesPerTrigger="2500").trigger(
        availableNow=True).start()
    assert query.awaitTermination(120)
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    assert [p["numInputRows"] for p in batches] == [25, 25, 25, 25]
    assert without_created(json.loads(batches[-1]["sources"][0]["latestOffset"])) == {"offset": 100, "stream": stream}


@pytest.mark.parametrize("options, message", [
    ({"endingOffsets": "5"}, "InvalidOptionError: endingOffsets is for batch reads; a streaming query reads on as "
                             "data arrives"),
    ({"endingTimestamp": "1700000000000"}, "InvalidOptionError: endingTimestamp is for batch reads"),
    ({"ledgers": "1"}, "InvalidOptionError: a streaming read follows one stream"),
])
def test_an_option_a_streaming_read_refuses_is_the_querys_error(spark, shared_uri, stream, options, message):
    """pyspark's source runner stops the reader in a `finally` also when creating it raised: a refusal raised from
    streamReader() ended in "UnboundLocalError: cannot access local variable 'reader'" (an audit's), the
    connector's message only earlier in the chain. The query's error ends with the connector's own."""
    write_entries(shared_uri, stream, 1)
    reader = spark.readStream.format("ledger").option("metadata", shared_uri)
    for key, value in options.items():
        reader = reader.option(key, value)
    loaded = reader.load() if "ledgers" in options else reader.load(stream)
    query = loaded.writeStream.format("memory").queryName("refused").start()
    try:
        with pytest.raises(Exception) as failed:
            query.awaitTermination(120)
    finally:
        query.stop()
    # The Python errors in the text, outermost last; Spark's description of the query follows them.
    raised = [line.strip() for line in str(failed.value).splitlines()
              if re.match(r"\s*[\w.]*(Error|Exception): ", line)]
    assert raised and message in raised[-1] and "UnboundLocalError" not in str(failed.value), str(failed.value)
