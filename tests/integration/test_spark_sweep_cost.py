"""Issue 14 item 2, DESIGN rule 15: a Spark commit's orphan sweep looks only at its own write job's or
streaming query's task ledgers, never at every ledger of the cluster, and still finds the orphan of an
attempt that stood still after it created its ledger.

Real ZooKeeper and storage nodes; tasks and commits without a SparkSession (tests/harness/spark_tasks.py).
The commit runs in a cluster that also holds UNRELATED ledgers of other jobs and queries, and the test
counts which ledgers' metadata it reads.
"""
import contextlib
import dataclasses

from connector.spark.recovery import JOB_TAG, STREAM_TAG
from connector.spark.stream_write import BATCH_TAG, QUERY_TAG
from metadata.model import Fragment, LedgerMetadata, LedgerState
from metadata.store import MetadataStore
from tests.harness.spark_tasks import (
    PausedAttempt, Task, TaskRunner, attempt_ledger, batch_writer, existing, id_batch, stream_sink,
)
from tests.integration.test_spark_commit_outcome import stream_ids

UNRELATED = 500


def unrelated_ledgers(store: MetadataStore, nodes, count: int) -> None:
    """count closed ledgers of other jobs and queries: the history of a busy cluster (metadata only, which is
    all a sweep could ever look at)."""
    for i in range(count):
        tags = {STREAM_TAG: "other", JOB_TAG: f"other-job-{i}"} if i % 2 else {QUERY_TAG: "other-query", BATCH_TAG: str(i)}
        meta = LedgerMetadata(
            ledger_id=0, ensemble_size=3, write_quorum=3, ack_quorum=2,
            fragments=(Fragment(0, tuple(n.node_id for n in nodes)),), state=LedgerState.CLOSED,
            custom_metadata=tuple(sorted(tags.items())),
        )
        store.create_ledger(meta)


@dataclasses.dataclass
class MetadataReads:
    """Which ledgers' metadata the code under watch read, and how often it listed the ledgers of the cluster."""

    ledgers: set[int] = dataclasses.field(default_factory=set)
    listings: int = 0


@contextlib.contextmanager
def metadata_reads(monkeypatch):
    reads = MetadataReads()
    read_ledger, list_ledgers = MetadataStore.read_ledger, MetadataStore.list_ledgers

    def counted_read(store, ledger_id):
        reads.ledgers.add(ledger_id)
        return read_ledger(store, ledger_id)

    def counted_list(store):
        reads.listings += 1
        return list_ledgers(store)

    with monkeypatch.context() as patch:
        patch.setattr(MetadataStore, "read_ledger", counted_read)
        patch.setattr(MetadataStore, "list_ledgers", counted_list)
        yield reads


# -- the sweep reads its own ledgers only ------------------------------------------------------------------------


def test_batch_commit_reads_only_its_own_jobs_ledgers(cluster, store, metadata_uri, monkeypatch):
    nodes = cluster(3)
    tasks = TaskRunner(monkeypatch)
    writer = batch_writer(metadata_uri)
    zombie = PausedAttempt(tasks, writer, Task(0, attempt=0))
    zombie_ledger = attempt_ledger(metadata_uri, 0, 0)
    unrelated_ledgers(store, nodes, UNRELATED)
    messages = [tasks.run(writer, Task(0, attempt=1), [id_batch(range(0, 100))]),
                tasks.run(writer, Task(1), [id_batch(range(100, 300))])]
    own = {m.ledger_id for m in messages} | {zombie_ledger}

    with metadata_reads(monkeypatch) as reads:
        writer.commit(messages)

    assert reads.ledgers <= own, f"the commit read the metadata of {len(reads.ledgers - own)} ledgers of other jobs"
    assert reads.listings == 0, "the commit listed every ledger of the cluster"
    assert zombie_ledger not in existing(metadata_uri, [zombie_ledger])  # the paused attempt's orphan: swept
    assert stream_ids(metadata_uri) == list(range(300))
    assert isinstance(zombie.finish(), Exception)  # fenced, or its job ended: it cannot add rows any more
    assert not existing(metadata_uri, [zombie_ledger])
    assert stream_ids(metadata_uri) == list(range(300))


def test_streaming_commit_reads_only_its_own_querys_ledgers(
    cluster, store, metadata_uri, monkeypatch, tmp_path
):
    nodes = cluster(3)
    tasks = TaskRunner(monkeypatch)
    sink = stream_sink(metadata_uri, tmp_path)
    zombie = PausedAttempt(tasks, sink, Task(0, attempt=0, batch=0))
    zombie_ledger = attempt_ledger(metadata_uri, 0, 0)
    unrelated_ledgers(store, nodes, UNRELATED)
    messages = [tasks.run(sink, Task(0, attempt=1, batch=0), [id_batch(range(0, 100))]),
                tasks.run(sink, Task(1, batch=0), [id_batch(range(100, 300))])]
    own = {m.ledger_id for m in messages} | {zombie_ledger}

    with metadata_reads(monkeypatch) as reads:
        stream_sink(metadata_uri, tmp_path).commit(messages, 0)  # Spark commits on a fresh instance

    assert reads.ledgers <= own, f"the commit read the metadata of {len(reads.ledgers - own)} ledgers of other queries"
    assert reads.listings == 0, "the commit listed every ledger of the cluster"
    assert not existing(metadata_uri, [zombie_ledger])
    assert isinstance(zombie.finish(), Exception)
    assert not existing(metadata_uri, [zombie_ledger])
    assert stream_ids(metadata_uri) == list(range(300))
