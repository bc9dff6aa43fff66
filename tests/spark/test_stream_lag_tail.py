"""`ledger stream lag` (issue 16 item 3) on a real streaming query's checkpoint, before and after the query catches
up, with a live writer's OPEN tail and after it is sealed; the source's INFO line after a batch; `ledger stream tail`
of an arrow stream written by Spark, checked against Spark's own read."""
import json
import logging

from connector.cli import main
from connector.client import LedgerClient, Streams
from connector.spark.schema import raw_read_schema
from connector.spark.stream_options import StreamOptions
from connector.spark.stream_read import LedgerStreamReader
from metadata import streams
from tests.harness.poll import poll_until



def payload(i: int) -> bytes:
    return f"e{i:03d}".encode()   # every entry the same size


def entry_bytes(lc: LedgerClient, stream: str) -> int:
    """The bytes an entry takes in its ledger's length (metadata), from the stream's sealed 10-entry ledgers."""
    sealed = [ledger for ledger in streams.read_stream(lc.store, stream).value.tail if ledger.last_offset is not None]
    lengths = {lc.ledger_metadata(ledger.ledger_id).length for ledger in sealed}
    assert len(lengths) == 1, lengths
    return lengths.pop() // 10


def catch_up(spark, uri, stream, checkpoint) -> None:
    """Run the query from its checkpoint until it has read everything there (Trigger.AvailableNow)."""
    query = (spark.readStream.format("ledger").option("metadata", uri).load(stream)
             .writeStream.format("noop").option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120)


def lag(capsys, checkpoint, *argv) -> list[dict]:
    assert main(["stream", "lag", "--checkpoint", str(checkpoint), "--json", *argv]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_lag_before_and_after_the_query_catches_up(spark, shared_uri, stream, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LEDGER_METADATA", shared_uri)
    checkpoint = tmp_path / "checkpoint"
    with LedgerClient(shared_uri) as lc:
        with Streams(lc).open_writer(stream, max_ledger_entries=10) as writer:
            for i in range(40):
                writer.append(payload(i))
        catch_up(spark, shared_uri, stream, checkpoint)
        [caught] = lag(capsys, checkpoint)
        assert (caught["stream"], caught["batch"], caught["committed_offset"], caught["latest_offset"],
                caught["rows_behind"], caught["bytes_behind"]) == (stream, 0, 40, 40, 0, 0)

        writer = Streams(lc).open_writer(stream, max_ledger_entries=10)
        for i in range(40, 100):   # 5 ledgers of 10 sealed, the last 10 in its OPEN ledger
            writer.append(payload(i))
        poll_until(lambda: [e.offset for e in Streams(lc).read(stream, 99)] == [99], 60, what="offset 99 readable")
        [behind] = lag(capsys, checkpoint)
        assert (behind["committed_offset"], behind["latest_offset"], behind["rows_behind"]) == (40, 100, 60)
        # 50 offsets in whole sealed ledgers (their lengths), 10 in the OPEN one at their average bytes per offset
        entry = entry_bytes(lc, stream)
        assert (behind["bytes_behind"], behind["estimated_offsets"]) == (60 * entry, 10)
        assert main(["stream", "lag", "--checkpoint", str(checkpoint)]) == 0
        table = capsys.readouterr().out
        assert "last committed batch 0" in table and f"~{60 * entry:,}" in table.split(stream)[1]

        writer.close()
        [sealed] = lag(capsys, checkpoint)
        assert (sealed["rows_behind"], sealed["bytes_behind"], sealed["estimated_offsets"]) == (60, 60 * entry, 0)

    catch_up(spark, shared_uri, stream, checkpoint)
    [after] = lag(capsys, checkpoint)
    assert (after["batch"], after["committed_offset"], after["latest_offset"], after["rows_behind"],
            after["bytes_behind"], after["planned_batch"]) == (1, 100, 100, 0, 0, None)


def test_the_source_logs_its_lag_at_info_after_each_batch(shared_uri, stream, caplog):
    with LedgerClient(shared_uri) as lc, Streams(lc).open_writer(stream, max_ledger_entries=10) as writer:
        for i in range(30):
            writer.append(payload(i))
        entry = entry_bytes(lc, stream)
    options, stream_options = StreamOptions.parse({"metadata": shared_uri, "path": stream})
    reader = LedgerStreamReader(options, stream_options, raw_read_schema(include_metadata=False), raw=True)
    with caplog.at_level(logging.INFO, logger="connector.spark.stream_read"):
        reader.commit({"offset": 15, "stream": stream})   # Spark calls commit once a batch is done
    assert (f"stream {stream!r}: committed offset 15, latest offset 30: 15 rows and ~{15 * entry:,} bytes behind"
            in caplog.text)


def test_tail_prints_an_arrow_streams_rows_as_spark_reads_them(spark, shared_uri, stream, capsys):
    (spark.range(300).selectExpr("id", "concat('name ', id) as name").write.format("ledger")
     .option("metadata", shared_uri).option("entryBytes", "1024").mode("append").save(stream))

    def tail(*argv) -> list[dict]:
        assert main(["stream", "tail", stream, "--metadata", shared_uri, *argv]) == 0
        return [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    everything = tail()
    read = spark.read.format("ledger").option("metadata", shared_uri).load(stream).collect()
    assert sorted((row["id"], row["name"]) for row in everything) == sorted((r["id"], r["name"]) for r in read)
    assert [row["_offset"] for row in everything] == list(range(300))
    # from the middle of an entry of a ledger with a row index: the same rows at the same offsets
    assert tail("--from", "245", "--max-rows", "30") == everything[245:275]
