"""A streaming query whose sink writes more than one stream under the same query id: restarted from its checkpoint
with another path (Kafka's sink then writes the next batches to the new topic), or a copied checkpoint. Its
registry then holds ledgers of several streams, and no sweep may delete one a stream holds.

Stream audit 2026-11-29: the sink's sweep asked only the stream it writes now, and the janitor only the stream the
query's run recorded, whether a ledger was committed: a committed ledger of the other stream whose registry entry
was still there (the sweep after its commit failed, or its driver died before it) was deleted, and that stream then
named a ledger that no longer exists: its rows lost, its offsets unreadable."""
import json

import pyarrow as pa
from pyspark.sql.types import LongType, StructField, StructType

from connector.bench.task_context import StandInTask
from connector.client import LedgerClient
from connector.spark import stream_write
from connector.spark.janitor import Cleaned, Registry, Sweep
from connector.spark.jobs import query_registry, task_entries
from connector.spark.stream_options import StreamOptions
from connector.spark.stream_write import LedgerStreamWriter
from connector.spark.write import write_task_ledger
from metadata import streams
from metadata.errors import LedgerError
from metadata.streams import find_stream

SCHEMA = StructType([StructField("id", LongType())])


def sink(uri: str, checkpoint, stream: str) -> LedgerStreamWriter:
    """The sink as Spark's driver prepares it for the query whose checkpoint is given, writing stream."""
    opts, stream_opts = StreamOptions.parse({"metadata": uri, "path": stream, "entryBytes": "1024",
                                             "checkpointLocation": str(checkpoint)})
    return LedgerStreamWriter.prepare(opts, stream_opts, SCHEMA)


def write_batch(writer: LedgerStreamWriter, batch_id: int, ids: range):
    """Batch batch_id's one task, as an executor runs it."""
    task = StandInTask(0, batch=batch_id)
    rows = pa.record_batch([pa.array(list(ids), pa.int64())], schema=writer.schema)
    return write_task_ledger(writer.options, writer.schema, iter([rows]), task, writer._tags(task, batch_id),
                             query_registry(writer.query_id, batch_id))


def commit_unswept(writer: LedgerStreamWriter, message, batch_id: int, monkeypatch) -> None:
    """Commit the batch; the sweep after it fails (a ZooKeeper error: "committed, but its registry was not swept"),
    as if the driver died between the multi and the sweep: the batch's entry stays in the query's registry."""
    def failing(store, entry):
        raise LedgerError("connection loss (scripted)")
    with monkeypatch.context() as scripted:
        scripted.setattr(stream_write, "forget_entry", failing)
        writer.commit([message], batch_id)


def ledgers_of(uri: str, stream: str) -> list[int]:
    """The ledgers the stream holds, each read (NoSuchLedgerError for one deleted)."""
    with LedgerClient(uri) as lc:
        record = find_stream(lc.store, stream).value
        return [lc.ledger_metadata(ledger.ledger_id).ledger_id for ledger in streams.iter_ledgers(lc.store, record)]


def checkpoint_of(tmp_path, query_id: str):
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text(json.dumps({"id": query_id}))
    return checkpoint


def test_a_query_restarted_on_another_stream_keeps_the_committed_ledgers_of_the_first(
        cluster, store, metadata_uri, tmp_path, monkeypatch):
    cluster(3)
    checkpoint = checkpoint_of(tmp_path, "moved-query")
    first = sink(metadata_uri, checkpoint, "first")
    committed = write_batch(first, 0, range(50))
    commit_unswept(first, committed, 0, monkeypatch)
    assert [e.ledger_id for e in task_entries(store, query_registry(first.query_id))] == [committed.ledger_id]

    second = sink(metadata_uri, checkpoint, "second")   # restarted from the checkpoint with another path
    second.commit([write_batch(second, 1, range(50, 80))], 1)   # its sweep goes through the registry up to 1

    assert ledgers_of(metadata_uri, "first") == [committed.ledger_id]   # NoSuchLedgerError before the fix
    assert len(ledgers_of(metadata_uri, "second")) == 1
    assert task_entries(store, query_registry(first.query_id)) == []


def test_the_janitors_sweep_keeps_a_ledger_committed_to_another_stream_than_the_runs(
        cluster, store, metadata_uri, tmp_path, monkeypatch):
    """The janitor sweeps a gone run's registry against the stream its run recorded: a ledger of the query's other
    stream is asked of its own stream too."""
    cluster(3)
    writer = sink(metadata_uri, checkpoint_of(tmp_path, "moved-query"), "second")
    committed = write_batch(writer, 0, range(50))
    commit_unswept(writer, committed, 0, monkeypatch)
    entries = task_entries(store, query_registry(writer.query_id))
    with LedgerClient(metadata_uri) as lc:
        outcome = Cleaned(Registry("query", writer.query_id, {}, frozenset()))
        Sweep(lc, [b""], patient=False, outcome=outcome)(entries, ["first"])   # the stream its run recorded
    assert outcome.kept == [committed.ledger_id] and outcome.deleted == []
    assert ledgers_of(metadata_uri, "second") == [committed.ledger_id]
