"""Sink to source: one streaming query reads the stream another streaming query writes."""
from chispa import assert_df_equality

from tests.harness.poll import poll_until
from tests.spark.stream_sink_job import start_query
from tests.spark.test_stream_sink import expected, write_input


def test_a_query_reads_what_another_query_writes_exactly_once(spark, shared_uri, stream, tmp_path):
    source, checkpoint = tmp_path / "in", tmp_path / "ck"
    write_input(source, "a.json", range(0, 40))
    writer = start_query(spark, shared_uri, stream, source, checkpoint)
    assert writer.awaitTermination(300) and writer.exception() is None

    reader = (
        spark.readStream.format("ledger").option("metadata", shared_uri).load(stream)
        .writeStream.format("memory").queryName("e2e").trigger(processingTime="200 milliseconds").start()
    )
    try:
        poll_until(lambda: spark.sql("select * from e2e").count() == 40, 120, what="the first 40 rows")
        write_input(source, "b.json", range(40, 100))
        writer = start_query(spark, shared_uri, stream, source, checkpoint)
        assert writer.awaitTermination(300) and writer.exception() is None
        poll_until(lambda: spark.sql("select * from e2e").count() >= 100, 120, what="all 100 rows")
        assert_df_equality(spark.sql("select id, value from e2e"), expected(spark, range(100)),
                           ignore_row_order=True, ignore_nullable=True)
    finally:
        reader.stop()
