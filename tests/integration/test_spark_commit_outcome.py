"""DESIGN rule 16 at the driver: a Spark batch commit whose ZooKeeper reply was lost is read back, not reported
failed, and an abort never deletes what a commit registered.

The driver-side commit() and abort() of connector/spark/write.py run against the real ZooKeeper and real
storage nodes; the driver's ZooKeeper connection goes through a loopback TCP proxy (connector/soak/proxy.py)
that loses the commit's request or its reply. The task ledgers are written by the same code a Spark task
runs (write_task_ledger), without a SparkSession.
"""
import threading

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StructField, StructType

from connector.bench.task_context import StandInTask
from connector.client import LedgerClient
from connector.soak.proxy import C2S, S2C, TcpProxy
from connector.spark.encoding import decode_entry
from connector.spark.errors import WriteJobCommittedError
from connector.spark.jobs import WriteJobEndedError, job_registry, query_registry, start_query
from connector.spark.options import LedgerOptions
from connector.spark.recovery import ATTEMPT_TAG, PARTITION_TAG, STREAM_TAG, TASK_TAG
from connector.spark.stream_write import BATCH_TAG, QUERY_TAG, LedgerStreamWriter
from connector.spark.write import LedgerWriter, write_task_ledger
from metadata import streams
from metadata.streams import find_stream
from tests.harness.lost_reply import LostReplies
from tests.harness.poll import poll_until

SCHEMA = StructType([StructField("id", LongType())])
STREAM = "events"


@pytest.fixture
def zk_proxy(zookeeper):
    with TcpProxy(zookeeper.host, zookeeper.port) as proxy:
        yield proxy


@pytest.fixture
def driver_uri(metadata_uri, zookeeper, zk_proxy) -> str:
    """The test's metadata root, reached through the proxy: the driver's commit and abort use it."""
    return metadata_uri.replace(zookeeper.address, zk_proxy.address)


def options(uri: str) -> LedgerOptions:
    return LedgerOptions.parse({"metadata": uri, "path": STREAM, "entryBytes": "1024"})


def run_tasks(writer: LedgerWriter, uri: str, *ranges: range) -> list:
    """One write task per range of ids, as executors would run them (straight to ZooKeeper, not proxied)."""
    messages = []
    for partition, ids in enumerate(ranges):
        batch = pa.record_batch([pa.array(list(ids), pa.int64())], schema=writer.schema)
        ctx = StandInTask(partition)
        messages.append(write_task_ledger(
            options(uri), writer.schema, iter([batch]), ctx, writer._tags(ctx), job_registry(writer.job_id),
        ))
    return messages


def commit_base(driver_uri: str, metadata_uri: str) -> None:
    """A first job with ids 0..99, committed without faults: the stream exists before the commit under test."""
    writer = LedgerWriter.prepare(options(driver_uri), SCHEMA, overwrite=False)
    writer.commit(run_tasks(writer, metadata_uri, range(0, 100)))


def stream_ids(uri: str) -> list[int]:
    """Every id the stream holds, in offset order; fails if a ledger the stream lists is gone or short."""
    ids = []
    with LedgerClient(uri) as lc:
        for ledger in streams.iter_ledgers(lc.store, find_stream(lc.store, STREAM).value):
            rows = [
                i for entry in lc.open_ledger(ledger.ledger_id, recover=False).read()
                for batch in decode_entry(entry.payload).batches for i in batch.column(0).to_pylist()
            ]
            assert len(rows) == ledger.last_offset - ledger.first_offset + 1
            ids += rows
    return ids


def lose_first_stream_write(monkeypatch, before_sending, after_sending) -> threading.Thread:
    """Run before_sending() just before the first stream CAS goes out and after_sending() meanwhile in a thread;
    returns that thread (the one call that sends the commit's set is wrapped, nothing else)."""
    real = streams.write_stream
    helper = threading.Thread(target=after_sending, daemon=True)

    def write_stream(store, record, expected_version):
        if helper.ident is None:
            before_sending()
            helper.start()
        return real(store, record, expected_version)

    monkeypatch.setattr(streams, "write_stream", write_stream)
    return helper


class LostReply:
    """The first stream CAS reaches ZooKeeper and its reply is lost: the proxy swallows replies from just before
    the set is sent until it has landed (seen on another session), then resets the driver's connection."""

    def __init__(self, monkeypatch, zk_proxy: TcpProxy, store, meanwhile=lambda: None):
        self.proxy, self.store, self.meanwhile = zk_proxy, store, meanwhile
        self.helper = lose_first_stream_write(monkeypatch, self._lose_replies, self._heal_once_landed)

    def _lose_replies(self):
        self.connections = self.proxy.stats().accepted
        self.version = streams.read_stream(self.store, STREAM).version
        self.proxy.set_mode("drop", direction=S2C)

    def _heal_once_landed(self):
        poll_until(lambda: streams.read_stream(self.store, STREAM).version > self.version, 30,
                   what="the commit's set to land")
        self.meanwhile()
        self.proxy.set_mode("pass")
        self.proxy.reset()

    def check_happened(self):
        self.helper.join(30)
        assert self.proxy.stats().accepted > self.connections, "the commit's connection was not cut"


@pytest.mark.parametrize("overwrite", [False, True], ids=["append", "overwrite"])
def test_commit_whose_reply_is_lost_reads_back_that_it_landed(
    cluster, store, metadata_uri, driver_uri, zk_proxy, monkeypatch, overwrite
):
    cluster(3)
    commit_base(driver_uri, metadata_uri)
    base_ledgers = [s.ledger_id for s in streams.iter_ledgers(store, find_stream(store, STREAM).value)]
    writer = LedgerWriter.prepare(options(driver_uri), SCHEMA, overwrite=overwrite)
    messages = run_tasks(writer, metadata_uri, range(100, 150), range(150, 300))

    lost = LostReply(monkeypatch, zk_proxy, store)
    writer.commit(messages)  # reports success: it read back that its job landed
    lost.check_happened()

    expected = list(range(100, 300)) if overwrite else list(range(300))
    assert stream_ids(metadata_uri) == expected
    if overwrite:
        with LedgerClient(metadata_uri) as lc:
            assert not set(base_ledgers) & set(lc.list_ledgers())
    # Spark may still call abort (another failure after the commit): it keeps what the commit registered, and
    # says so (Spark reports the write failed).
    with pytest.raises(WriteJobCommittedError, match="its rows WERE committed"):
        writer.abort(messages)
    assert stream_ids(metadata_uri) == expected
    # A retry of the same job's commit finds it committed and adds nothing.
    writer.commit(messages)
    assert stream_ids(metadata_uri) == expected


def test_streaming_commit_whose_reply_is_lost_keeps_its_batch(
    cluster, store, metadata_uri, driver_uri, zk_proxy, monkeypatch
):
    cluster(3)
    commit_base(driver_uri, metadata_uri)
    sink = LedgerStreamWriter(options(driver_uri), pa.schema([("id", pa.int64())]), "query-1")
    batch = pa.record_batch([pa.array(range(100, 200), pa.int64())], schema=sink.schema)
    tags = {STREAM_TAG: STREAM, QUERY_TAG: "query-1", BATCH_TAG: 0, PARTITION_TAG: 0, ATTEMPT_TAG: 0, TASK_TAG: 0}
    start_query(store, "query-1")
    messages = [write_task_ledger(
        options(metadata_uri), sink.schema, iter([batch]), StandInTask(0), tags, query_registry("query-1", 0),
    )]

    lost = LostReply(monkeypatch, zk_proxy, store)
    sink.commit(messages, 0)  # finds batch 0 with its own ledger: done, not a replay to discard
    lost.check_happened()
    assert stream_ids(metadata_uri) == list(range(200))
    sink.commit(messages, 0)
    assert stream_ids(metadata_uri) == list(range(200))


def test_commit_whose_request_is_lost_commits_once(cluster, store, metadata_uri, driver_uri, zk_proxy, monkeypatch):
    cluster(3)
    commit_base(driver_uri, metadata_uri)
    version = streams.read_stream(store, STREAM).version
    writer = LedgerWriter.prepare(options(driver_uri), SCHEMA, overwrite=False)
    messages = run_tasks(writer, metadata_uri, range(100, 200))
    swallowed = zk_proxy.stats().dropped[C2S]

    def heal_once_swallowed():
        # The set never reaches ZooKeeper (the request is swallowed): cut the connection.
        poll_until(lambda: zk_proxy.stats().dropped[C2S] > swallowed + 100, 30, what="the commit's set to be lost")
        zk_proxy.set_mode("pass")
        zk_proxy.reset()

    helper = lose_first_stream_write(monkeypatch, lambda: zk_proxy.set_mode("drop", direction=C2S), heal_once_swallowed)
    writer.commit(messages)  # read back: not landed, so the CAS is sent again
    helper.join(30)
    assert streams.read_stream(store, STREAM).version == version + 1  # one CAS landed, not two
    assert stream_ids(metadata_uri) == list(range(200))


def test_abort_fences_a_commit_still_in_flight(cluster, store, metadata_uri, driver_uri, monkeypatch):
    """The commit's set is held in the network (here: the commit thread stands still just before sending it)
    until after an abort of the job has run: it must not land on ledgers the abort deleted."""
    cluster(3)
    commit_base(driver_uri, metadata_uri)
    writer = LedgerWriter.prepare(options(driver_uri), SCHEMA, overwrite=False)
    messages = run_tasks(writer, metadata_uri, range(100, 200))
    job_ledgers = {m.ledger_id for m in messages}
    in_flight, deliver = threading.Event(), threading.Event()
    real = streams.write_stream

    def held_write_stream(store_, record, expected_version):
        if not in_flight.is_set():
            in_flight.set()
            assert deliver.wait(60)
        return real(store_, record, expected_version)

    monkeypatch.setattr(streams, "write_stream", held_write_stream)
    outcome = []

    def commit():
        try:
            writer.commit(messages)
            outcome.append("committed")
        except WriteJobEndedError as exc:
            outcome.append(exc)

    committer = threading.Thread(target=commit, daemon=True)
    committer.start()
    assert in_flight.wait(60)
    # Spark's abort runs on its own copy of the writer, with its own ZooKeeper session.
    LedgerWriter(options(metadata_uri), writer.schema, writer.job_id, overwrite=False).abort(messages)
    deliver.set()
    committer.join(60)

    assert stream_ids(metadata_uri) == list(range(100))  # every listed ledger exists; no row of the job
    with LedgerClient(metadata_uri) as lc:
        assert not job_ledgers & set(lc.list_ledgers())
    assert isinstance(outcome[0], WriteJobEndedError)


def test_a_job_a_janitor_ended_cannot_commit_after_its_mark_left_the_head(cluster, store, metadata_uri, driver_uri):
    """Helper audit 2026-11-29 finding 2: the janitor's mark that a job is aborted is one of the head's newest
    JOBS_KEPT job outcomes. Once that many other jobs had ended on the stream, the commit of a job whose driver the
    janitor had found gone (only cut off, still running) registered ledgers the janitor had deleted. The job's
    registry, which the janitor removes after the mark, must exist for the commit to land."""
    from connector.spark.commit import COMMITTED, JOBS_KEPT, with_job
    from connector.spark.janitor import record_aborted
    from connector.spark.jobs import end_job, remove_job
    from connector.spark.recovery import discard

    cluster(3)
    commit_base(driver_uri, metadata_uri)
    writer = LedgerWriter.prepare(options(driver_uri), SCHEMA, overwrite=False)
    messages = run_tasks(writer, metadata_uri, range(100, 200))
    with LedgerClient(metadata_uri) as lc:   # the janitor, as _clean_job does it
        end_job(store, writer.job_id)
        record_aborted(store, STREAM, writer.job_id)
        for message in messages:
            discard(lc, message.ledger_id, b"")
        remove_job(store, writer.job_id)
    for n in range(JOBS_KEPT):   # other jobs end on the stream meanwhile: the mark leaves the head
        streams.update_stream(store, STREAM, lambda r, n=n: with_job(r, f"job-{n}", COMMITTED))
    with pytest.raises(WriteJobEndedError, match="ended by a janitor"):
        writer.commit(messages)
    assert stream_ids(metadata_uri) == list(range(100))   # every listed ledger exists; no row of the job


def test_a_job_whose_registry_goes_between_its_commits_read_and_its_cas_does_not_commit(
        cluster, store, metadata_uri, driver_uri, monkeypatch):
    """Review 2026-11-29: the commit's look at its registry was a read before the CAS. A janitor that removed the
    registry in between (its mark already gone from the head) let the commit land. The registry is now checked in
    the commit's multi as well."""
    from connector.spark.jobs import remove_job

    cluster(3)
    commit_base(driver_uri, metadata_uri)
    writer = LedgerWriter.prepare(options(driver_uri), SCHEMA, overwrite=False)
    messages = run_tasks(writer, metadata_uri, range(100, 200))
    real = streams.write_stream
    removed = []

    def write_stream(store_, record, expected_version):
        if not removed:   # the janitor, between the transform's read and the multi
            removed.append(writer.job_id)
            remove_job(store, writer.job_id)
        return real(store_, record, expected_version)

    monkeypatch.setattr(streams, "write_stream", write_stream)
    with pytest.raises(WriteJobEndedError, match="ended by a janitor"):
        writer.commit(messages)
    assert removed and stream_ids(metadata_uri) == list(range(100))


def test_a_job_cannot_commit_after_a_janitor_died_between_deleting_its_ledgers_and_removing_its_registry(
        cluster, store, metadata_uri, driver_uri, monkeypatch):
    """The registry's existence was the fence that outlives the janitor's mark on the head, but the janitor removes it
    only after it deleted the job's ledgers. A janitor that died in between (or stalled there) left the registry, and
    once JOBS_KEPT other jobs had ended on the stream, the cut-off driver's commit registered the deleted ledgers. The
    janitor now fences the registry before it deletes anything, and the commit checks the fence in its multi."""
    from connector.spark import janitor
    from connector.spark.commit import COMMITTED, JOBS_KEPT, with_job
    from metadata import layout
    from metadata.errors import LedgerError

    cluster(3)
    commit_base(driver_uri, metadata_uri)
    writer = LedgerWriter.prepare(options(driver_uri), SCHEMA, overwrite=False)
    messages = run_tasks(writer, metadata_uri, range(100, 200))
    store.delete(layout.writer_path(janitor.read_job(store, writer.job_id).driver))   # its session expired: cut off
    [found] = [f for f in janitor.find_registries(store, STREAM) if f.owner == writer.job_id]
    assert found.state == janitor.ABANDONED

    def dies(*_):
        raise LedgerError("the janitor's process died here")

    monkeypatch.setattr(janitor, "remove_job", dies)
    with LedgerClient(metadata_uri) as lc:
        outcome = janitor.clean(lc, found, [b""])
    assert outcome.error and outcome.deleted == [message.ledger_id for message in messages]
    for n in range(JOBS_KEPT):   # other jobs end on the stream meanwhile: the mark leaves the head
        streams.update_stream(store, STREAM, lambda r, n=n: with_job(r, f"job-{n}", COMMITTED))
    with pytest.raises(WriteJobEndedError, match="ended by a janitor"):
        writer.commit(messages)
    assert stream_ids(metadata_uri) == list(range(100))   # every listed ledger exists; no row of the job


def test_a_drivers_own_end_read_before_a_janitors_fence_does_not_take_it_away(store, monkeypatch):
    """The driver's commit and abort end the job's registry (read, then write); written over a janitor's fence made
    in between, a plain write took the fence away."""
    from connector.spark import jobs

    jobs.start_job(store, "job-1", STREAM, "driver-1")
    real, fenced = store.read, []

    def read(path, decode):
        found = real(path, decode)
        if not fenced:   # the janitor, between the driver's read and its write
            fenced.append(True)
            jobs.end_job(store, "job-1", fence=True)
        return found

    monkeypatch.setattr(store, "read", read)
    jobs.end_job(store, "job-1")
    monkeypatch.undo()
    assert fenced and jobs.commit_guard(store, job_registry("job-1").path).fenced


def test_a_batch_in_flight_when_the_drivers_registration_changes_is_committed_with_its_rows(
        cluster, metadata_uri, tmp_path):
    """Helper audits 2026-11-29 (two of them): Spark asks the sink for a new writer for every commit. When the driver's
    registration had changed since the batch's tasks ran (its keeper died, or its session expired), that writer's
    prepare ran the janitor, which found the query's only run (the old registration) gone and deleted the batch's
    ledgers; the commit under the new registration then put the deleted ledgers on the stream and recorded the batch
    committed: its rows lost, every read over them failing. A starting run now leaves its own query's registry to
    its sweeps, and a commit checks its ledgers' registry entries in its multi (a sweep withdraws them first)."""
    from connector.spark import LedgerDataSource, driver
    from connector.spark.jobs import query_registry

    cluster(3)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text('{"id": "registration-change-test"}')
    source = LedgerDataSource({"metadata": metadata_uri, "path": STREAM, "checkpointLocation": str(checkpoint),
                               "entryBytes": "1024"})
    sink = source.streamWriter(SCHEMA, False)          # the query's start, under registration D1
    batch = pa.record_batch([pa.array(list(range(50)), pa.int64())], schema=sink.schema)
    ctx = StandInTask(0)
    message = write_task_ledger(sink.options, sink.schema, iter([batch]), ctx, sink._tags(ctx, 0),
                                query_registry(sink.query_id, 0))
    driver.end_registrations()                          # D1 ends: the driver's keeper died, say
    source.streamWriter(SCHEMA, False).commit([message], 0)   # Spark's writer for the commit, under D2
    assert stream_ids(metadata_uri) == list(range(50))


def test_a_commit_whose_reply_is_lost_while_its_outcome_leaves_the_head_commits_once(
        cluster, store, metadata_uri, driver_uri, zk_proxy, monkeypatch):
    """Helper audit 2026-11-29: a commit's read-back looked for the job's outcome on the head, which keeps the newest
    JOBS_KEPT only. When as many jobs ended on the stream while the driver waited for ZooKeeper (a burst after an
    outage), the read-back found nothing and committed the job a second time: every row twice. The commit's multi
    now stamps the job's registry committed, and the read-back finds that."""
    from connector.spark.commit import COMMITTED, JOBS_KEPT, with_job

    cluster(3)
    commit_base(driver_uri, metadata_uri)
    writer = LedgerWriter.prepare(options(driver_uri), SCHEMA, overwrite=False)
    messages = run_tasks(writer, metadata_uri, range(100, 200))

    def other_jobs_end():
        for n in range(JOBS_KEPT):
            streams.update_stream(store, STREAM, lambda r, n=n: with_job(r, f"job-{n}", COMMITTED))

    lost = LostReply(monkeypatch, zk_proxy, store, meanwhile=other_jobs_end)
    writer.commit(messages)
    lost.check_happened()
    assert stream_ids(metadata_uri) == list(range(200))


def test_an_abort_after_a_landed_commit_whose_outcome_left_the_head_keeps_its_rows(
        cluster, store, metadata_uri, driver_uri, monkeypatch):
    """Helper audit 2026-11-29 (follow-up): an abort kept the ledgers a landed commit registered only when the head
    still held the job's outcome. A commit that landed and then failed (ZooKeeper unreachable past the wait bound for
    its read-back), while JOBS_KEPT other jobs ended on the stream, was aborted by Spark: the abort deleted the
    committed ledgers, and every read over them failed."""
    from connector.spark.commit import COMMITTED, JOBS_KEPT, with_job
    from metadata.errors import ZooKeeperUnreachableError

    cluster(3)
    commit_base(driver_uri, metadata_uri)
    writer = LedgerWriter.prepare(options(driver_uri), SCHEMA, overwrite=False)
    messages = run_tasks(writer, metadata_uri, range(100, 200))
    real, calls = streams.write_stream, []

    def write_stream(store_, record, expected_version):
        calls.append(expected_version)
        landed = real(store_, record, expected_version)
        if len(calls) > 1:
            return landed
        for n in range(JOBS_KEPT):   # other jobs end on the stream
            streams.update_stream(store, STREAM, lambda r, n=n: with_job(r, f"job-{n}", COMMITTED))
        raise ZooKeeperUnreachableError(f"no reply (the commit landed at version {landed.version})")

    monkeypatch.setattr(streams, "write_stream", write_stream)
    with pytest.raises(ZooKeeperUnreachableError):
        writer.commit(messages)
    monkeypatch.undo()
    with pytest.raises(WriteJobCommittedError, match="its rows WERE committed"):
        writer.abort(messages)   # Spark aborts the job whose commit failed
    assert stream_ids(metadata_uri) == list(range(200))


class DriverDied(BaseException):
    """Stands for the driver's process ending at that point (nothing after it runs)."""


def test_the_ledgers_an_overwrite_replaced_are_deleted_after_its_driver_died_before_deleting_them(
        cluster, store, metadata_uri, driver_uri, monkeypatch):
    """Helper audit 2026-11-29: once an overwrite's commit landed, the ledgers of the head it replaced were named
    nowhere (no head, no registry): a driver that died before deleting them left them for good. The overwrite's multi
    now writes a cut record naming them, which the stream's next job start finishes."""
    from connector.spark import write

    cluster(3)
    commit_base(driver_uri, metadata_uri)
    base = [s.ledger_id for s in streams.iter_ledgers(store, find_stream(store, STREAM).value)]
    writer = LedgerWriter.prepare(options(driver_uri), SCHEMA, overwrite=True)
    messages = run_tasks(writer, metadata_uri, range(100, 150))

    def dies(*_):
        raise DriverDied()

    monkeypatch.setattr(write, "finish_cut", dies, raising=False)   # (the code before this fix deleted them here:)
    monkeypatch.setattr(write, "drop_below", dies, raising=False)
    with pytest.raises(DriverDied):
        writer.commit(messages)
    monkeypatch.undo()
    assert stream_ids(metadata_uri) == list(range(100, 150))
    LedgerWriter.prepare(options(driver_uri), SCHEMA, overwrite=False)   # the stream's next job start
    with LedgerClient(metadata_uri) as lc:
        assert not set(base) & set(lc.list_ledgers())
    assert stream_ids(metadata_uri) == list(range(100, 150))


@pytest.mark.parametrize("step", ["read_job", "commit_guard"])   # where the second janitor is when the first ends
def test_a_commit_whose_reply_is_lost_while_janitors_clean_its_job_is_reported_committed(
        cluster, store, metadata_uri, driver_uri, zk_proxy, monkeypatch, step):
    """Review 2026-11-29: a commit landed and its reply was lost; while the driver waited for ZooKeeper, 100 jobs ended
    on the stream and a janitor (finding the driver's registration gone) cleaned the job: it kept the ledgers the
    stream held and removed the registry. The read-back then found no outcome and no registry and reported "none of
    its rows were committed ... run the write again": the rows were committed, and a rerun wrote them twice. A second
    janitor that had found the registry too recorded the job aborted once the first had removed it: the read-back then
    found the job aborted (review 2 of 2026-11-29)."""
    from connector.spark import janitor
    from connector.spark.commit import COMMITTED, JOBS_KEPT, with_job
    from metadata import layout

    cluster(3)
    commit_base(driver_uri, metadata_uri)
    writer = LedgerWriter.prepare(options(driver_uri), SCHEMA, overwrite=False)
    messages = run_tasks(writer, metadata_uri, range(100, 200))
    cleaned = []

    def others_end_and_a_janitor_cleans():
        for n in range(JOBS_KEPT):
            streams.update_stream(store, STREAM, lambda r, n=n: with_job(r, f"job-{n}", COMMITTED))
        store.delete(layout.writer_path(janitor.read_job(store, writer.job_id).driver))   # its session expired
        [found] = [f for f in janitor.find_registries(store, STREAM) if f.owner == writer.job_id]
        real = getattr(janitor, step)

        def another_janitor_cleans_first(*args):
            monkeypatch.setattr(janitor, step, real)   # this janitor is at `step`; another one cleans the job now
            cleaned.append(janitor.clean(lc, found, [b""]))
            return real(*args)

        with LedgerClient(metadata_uri) as lc:
            monkeypatch.setattr(janitor, step, another_janitor_cleans_first)
            cleaned.append(janitor.clean(lc, found, [b""]))

    lost = LostReply(monkeypatch, zk_proxy, store, meanwhile=others_end_and_a_janitor_cleans)
    writer.commit(messages)   # reports success: its rows are on the stream
    lost.check_happened()
    assert not cleaned[0].error and cleaned[0].kept == [message.ledger_id for message in messages]
    assert cleaned[1].skipped   # it found the registry removed: the job's outcome was decided
    assert stream_ids(metadata_uri) == list(range(200))
    assert (writer.job_id, "aborted") not in streams.read_stream(store, STREAM).value.jobs


@pytest.mark.parametrize("step", ["end_job", "withdraw", "delete_ledger"])
def test_a_commit_whose_preliminary_write_lost_its_reply_commits(cluster, store, metadata_uri, monkeypatch, step):
    """Lost-reply audit 2026-11-29 (finding 3): the writes a commit makes before its stream CAS (end_job's stamp of
    the job's registry; the withdraw of an unreported attempt's entry, and the delete of its ledger) raised on a lost
    reply, though each is idempotent: the commit failed, Spark aborted the job, and the abort threw away every row
    the job had written. Each now reads back (or sends again) what it wrote."""
    from connector.spark.jobs import TaskEntry
    from metadata import layout

    cluster(3)
    commit_base(metadata_uri, metadata_uri)
    writer = LedgerWriter.prepare(options(metadata_uri), SCHEMA, overwrite=False)
    messages = run_tasks(writer, metadata_uri, range(100, 150), range(150, 300))
    unreported = messages[1].ledger_id   # an attempt whose report Spark did not pass on (speculative, say)
    path = {"end_job": job_registry(writer.job_id).path,
            "withdraw": TaskEntry(job_registry(writer.job_id).path, unreported).path,
            "delete_ledger": layout.ledger_path(unreported)}[step]
    lost = LostReplies(monkeypatch, lambda operation, at, kwargs: operation in ("set", "delete") and at == path)
    writer.commit(messages[:1])
    assert lost.lost
    assert stream_ids(metadata_uri) == list(range(150))
    assert unreported not in store.list_ledgers()
    assert streams.read_stream(store, STREAM).value.jobs[-1] == (writer.job_id, "committed")


def test_a_job_start_whose_reply_is_lost_starts_the_job(cluster, store, metadata_uri, monkeypatch):
    """Lost-reply audit 2026-11-29 (finding 3): the create of the job's registry (prepare's start_job) raised."""
    from metadata import layout

    cluster(3)
    lost = LostReplies(monkeypatch, lambda operation, path, kwargs: operation == "create" and path.startswith(
        f"{layout.SPARK_JOBS}/"))
    writer = LedgerWriter.prepare(options(metadata_uri), SCHEMA, overwrite=False)
    assert lost.lost == [("create", job_registry(writer.job_id).path)]
    writer.commit(run_tasks(writer, metadata_uri, range(100)))
    assert stream_ids(metadata_uri) == list(range(100))


def test_an_abort_after_a_landed_commit_whose_outcome_stayed_unknown_says_its_rows_were_committed(
        cluster, store, metadata_uri, driver_uri, zk_proxy, monkeypatch):
    """Lost-reply audit 2026-11-29 (finding 6): ZooKeeper away longer than $LEDGER_ZK_WAIT_SECONDS after the commit's
    CAS landed: the commit raises UpdateOutcomeUnknownError, and Spark aborts the job. The abort learnt that the job
    had committed but only logged it, while Spark reported the write failed: a user who ran it again had every row
    twice. The abort now raises, naming the job and the stream, that the rows were committed."""
    from metadata.store import ZK_WAIT_ENV
    from metadata.streams import UpdateOutcomeUnknownError

    cluster(3)
    commit_base(driver_uri, metadata_uri)
    writer = LedgerWriter.prepare(options(driver_uri), SCHEMA, overwrite=False)
    messages = run_tasks(writer, metadata_uri, range(100, 200))
    monkeypatch.setenv(ZK_WAIT_ENV, "2")

    def zookeeper_away():   # after the CAS landed: the driver's connection is cut, and nothing answers a new one
        zk_proxy.set_mode("drop")
        zk_proxy.reset()

    lost = LostReplies(monkeypatch, lambda operation, path, kwargs: operation == "multi" and any(
        part.startswith("SetData:") and part.endswith(f"/streams/{STREAM}") for part in path.split()),
        meanwhile=zookeeper_away)
    with pytest.raises(UpdateOutcomeUnknownError):
        writer.commit(messages)
    assert lost.lost
    zk_proxy.set_mode("pass")
    zk_proxy.reset()
    with pytest.raises(WriteJobCommittedError, match=f"write job {writer.job_id}: its rows WERE committed to stream "
                                                     f"'{STREAM}'.*Do NOT run this write again"):
        writer.abort(messages)   # what Spark does next
    assert stream_ids(metadata_uri) == list(range(200))
    assert streams.read_stream(store, STREAM).value.jobs[-1] == (writer.job_id, "committed")
