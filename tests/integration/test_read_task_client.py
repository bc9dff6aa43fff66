"""Read tasks in one Python worker share one LedgerClient (connector/spark/task_client.py), and give it up when
a task fails, when their settings change, or when it grows old.

Partitions are read in this process with the code an executor runs (reader.read(partition)); which client a
task used is seen in ZooKeeper: every LedgerClient registers a writer znode, and the writers folder's child
version (cversion) counts every registration made and ended. tests/conftest.py closes the shared client after
every test, so each starts without one.
"""
from __future__ import annotations

import pytest

from connector.client import LedgerClient, NoSuchLedgerError, Streams
from connector.spark import LedgerDataSource, task_client
from metadata import layout
from metadata.store import MetadataStore

ENTRIES = 12  # in ledgers of 2 entries: 6 partitions


@pytest.fixture
def raw_stream(metadata_uri, cluster) -> str:
    cluster(3)
    with LedgerClient(metadata_uri) as lc, Streams(lc).open_writer("events", max_ledger_entries=2) as sw:
        for n in range(ENTRIES):
            sw.append(b"entry %d" % n)
    return "events"


def reader_of(uri: str, stream: str, **options):
    """A batch reader planning one partition per ledger (maxPartitionBytes=0: small ledgers are not packed), so
    that each partition stands for one Spark task."""
    source = LedgerDataSource({"metadata": uri, "path": stream, "maxPartitionBytes": "0", **options})
    return source.reader(source.schema())


def registrations(store: MetadataStore) -> tuple[int, set[str]]:
    """(writer registrations made and ended so far, the live ones)."""
    stat = store.zk.exists(layout.WRITERS)
    return stat.cversion, set(store.children(layout.WRITERS))


def read_all(reader, partitions) -> int:
    return sum(batch.num_rows for p in partitions for batch in reader.read(p))


def test_the_partitions_of_a_read_share_one_client_that_outlives_them(metadata_uri, raw_stream):
    reader = reader_of(metadata_uri, raw_stream)
    partitions = reader.partitions()
    assert len(partitions) == ENTRIES // 2
    with MetadataStore(metadata_uri) as store:
        changes, live = registrations(store)
        assert read_all(reader, partitions) == ENTRIES
        assert read_all(reader, partitions) == ENTRIES
        changes_after, live_after = registrations(store)
        # One client for twelve partition reads: one registration, still live for the next task. A client per
        # partition made and ended twelve.
        assert changes_after - changes == 1, (changes, changes_after)
        (shared,) = live_after - live
        task_client.close_shared()
        assert shared not in registrations(store)[1]


def test_a_task_stopped_early_leaves_the_client_to_the_next(metadata_uri, raw_stream):
    reader = reader_of(metadata_uri, raw_stream)
    first, second = reader.partitions()[:2]
    with MetadataStore(metadata_uri) as store:
        changes, _ = registrations(store)
        batches = reader.read(first)
        next(batches)
        batches.close()  # GeneratorExit in the task: Spark stopped reading (a limit), nothing went wrong
        assert read_all(reader, [second]) == 2
        assert registrations(store)[0] - changes == 1


def test_a_failed_task_gives_the_client_up_and_the_next_task_opens_a_new_one(metadata_uri, raw_stream):
    reader = reader_of(metadata_uri, raw_stream)
    partitions = reader.partitions()
    with MetadataStore(metadata_uri) as store:
        _, planning = registrations(store)   # with the planning steps' client, which stays
        read_all(reader, partitions[1:2])
        live = registrations(store)[1] - planning
        with LedgerClient(metadata_uri) as lc:
            lc.delete_ledger(partitions[0].ledger_id)  # gone since planning, its offsets still in the stream
        with pytest.raises(NoSuchLedgerError):
            read_all(reader, partitions[:1])
        _, live_after_failure = registrations(store)
        assert not live & live_after_failure  # the failed task's client is closed
        assert read_all(reader, partitions[1:]) == ENTRIES - 2
        assert len(registrations(store)[1] - live_after_failure) == 1


def test_other_settings_or_an_old_client_get_a_new_client_and_the_old_one_is_closed(
        metadata_uri, raw_stream, tmp_path, monkeypatch):
    reader = reader_of(metadata_uri, raw_stream)
    partition = reader.partitions()[0]
    token = tmp_path / "token"
    token.write_text("a-token\n")
    with_token = reader_of(metadata_uri, raw_stream, authTokenFile=str(token))
    with MetadataStore(metadata_uri) as store:
        _, before = registrations(store)    # with the planning steps' client, which stays
        read_all(reader, [partition])
        (first,) = registrations(store)[1] - before
        read_all(with_token, [partition])
        (second,) = registrations(store)[1] - before
        assert second != first  # nodes without --auth-token-file accept a token and ignore it
        monkeypatch.setattr(task_client, "REUSE_SECONDS", 0.0)
        read_all(with_token, [partition])
        (third,) = registrations(store)[1] - before
        assert third not in (first, second)
