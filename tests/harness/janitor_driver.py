"""A Spark write driver in a process of its own, without a SparkSession, for the janitor tests: the driver
side (prepare, commit) as Spark calls it and the task side with a stand-in TaskContext. Being the driver
process itself, it holds its liveness registration on its own session (connector/spark/driver.py).

python -m tests.harness.janitor_driver URI STREAM MODE

    job        a batch write job: partition 0's ledger written and closed, partition 1's OPEN with rows in
               it (its task stands still)
    committed  a batch write job whose commit CAS landed (its ledgers are on the stream) and whose driver
               has not yet removed its registry: it died right after the commit
    query      a streaming query: batch 0 committed, batch 1's task ledgers written (one closed, one OPEN)
               and not committed

It prints `ready <job or query id> <driver id> <ledger id>...` (the task ledgers in flight) and waits for a
line on standard input: `commit` commits what it wrote (the job, or batch 1) and prints `committed` or
`commit failed: <error>`, then exits. The tests kill it (SIGKILL) or pause it (SIGSTOP) while it waits.
"""
import json
import sys
import tempfile
import threading

from connector.bench.task_context import StandInTask
from connector.spark.jobs import job_registry, query_registry
from connector.spark.options import LedgerOptions
from connector.spark.stream_options import StreamOptions
from connector.spark.stream_write import LedgerStreamWriter
from connector.spark.write import LedgerWriter
from metadata.errors import LedgerError
from metadata.store import MetadataStore
from tests.harness.spark_tasks import SCHEMA, id_batch

ROWS = 2000  # per task: 16 KB of ids, entries of 1 KiB


class Tasks:
    """Runs writer.write() as task attempts: TaskContext.get() answers the task of the calling thread."""

    def __init__(self):
        from pyspark import TaskContext

        self.current = threading.local()
        TaskContext.get = staticmethod(lambda: self.current.task)

    def run(self, writer, task: StandInTask, batches):
        self.current.task = task
        return writer.write(iter(batches))

    def held(self, writer, task: StandInTask, first: int) -> threading.Event:
        """A task that writes ROWS rows and stands still before its last one, its ledger OPEN: returns the
        event set once its rows are appended."""
        appended = threading.Event()

        def batches():
            yield id_batch(range(first, first + ROWS))
            yield id_batch(range(first + ROWS, first + ROWS + 1))  # asked for once the first batch is appended
            appended.set()
            threading.Event().wait()  # stands still, its ledger OPEN

        def run():
            self.current.task = task
            writer.write(batches())

        threading.Thread(target=run, daemon=True).start()
        return appended


def options(uri: str, stream: str, **more: str) -> dict[str, str]:
    return {"metadata": uri, "path": stream, "entryBytes": "1024", **more}


def in_flight(uri: str, registry_path: str) -> list[int]:
    with MetadataStore(uri) as store:
        return sorted(int(name[1:].split("-")[0]) for name in store.children(registry_path) if name.startswith("L"))


def batch_job(uri: str, stream: str, commit_now: bool):
    tasks = Tasks()
    writer = LedgerWriter.prepare(LedgerOptions.parse(options(uri, stream)), SCHEMA, overwrite=False)
    done = tasks.run(writer, StandInTask(0), [id_batch(range(0, ROWS))])
    if commit_now:
        other = tasks.run(writer, StandInTask(1), [id_batch(range(ROWS, 2 * ROWS))])
        with MetadataStore(uri) as store:
            writer._register(store, [done, other])  # the commit's CAS; the driver dies before removing its registry
        messages = [done, other]
    else:
        assert tasks.held(writer, StandInTask(1), ROWS).wait(60)
        messages = [done]
    with MetadataStore(uri) as store:
        driver = store.read(job_registry(writer.job_id).path, json.loads).value.get("driver", "")
    ledgers = in_flight(uri, job_registry(writer.job_id).path)
    return writer.job_id, driver, ledgers, lambda: writer.commit(messages)


def query(uri: str, stream: str):
    tasks = Tasks()
    checkpoint = tempfile.mkdtemp()
    with open(f"{checkpoint}/metadata", "w") as f:
        json.dump({"id": "query-1"}, f)
    opts, stream_opts = StreamOptions.parse(options(uri, stream, checkpointLocation=checkpoint))
    sink = LedgerStreamWriter.prepare(opts, stream_opts, SCHEMA)
    batch0 = [tasks.run(sink, StandInTask(p, batch=0), [id_batch(range(p * ROWS, (p + 1) * ROWS))]) for p in (0, 1)]
    sink.commit(batch0, 0)
    closed = tasks.run(sink, StandInTask(0, batch=1), [id_batch(range(2 * ROWS, 3 * ROWS))])
    assert tasks.held(sink, StandInTask(1, batch=1), 3 * ROWS).wait(60)
    ledgers = in_flight(uri, query_registry(sink.query_id).path)
    return sink.query_id, getattr(sink, "driver_id", ""), ledgers, lambda: sink.commit([closed], 1)


def main(uri: str, stream: str, mode: str) -> int:
    if mode == "query":
        owner, driver, ledgers, commit = query(uri, stream)
    else:
        owner, driver, ledgers, commit = batch_job(uri, stream, commit_now=mode == "committed")
    print("ready", owner, driver, *ledgers, flush=True)
    if sys.stdin.readline().strip() != "commit":
        return 0
    try:
        commit()
    except LedgerError as exc:
        print(f"commit failed: {type(exc).__name__}: {exc}", flush=True)
        return 0
    print("committed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
