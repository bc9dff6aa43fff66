"""A write whose executor is SIGKILLed mid-write, under local-cluster[2,1,1024] (real executor processes).

`python -m tests.spark.executor_kill_job URI STREAM MARKER` writes ids 0..ROWS-1 in 4 partitions. The
first attempt of partition 0 notes the pid of its executor JVM and, after HOLD_AT_BATCH input batches,
holds its input back until MARKER exists; a driver thread waits until that attempt's ledger holds an
acknowledged entry, SIGKILLs the executor and records the ledger id in MARKER. Spark retries the task
on a new executor and the job commits.
"""
import os
import pathlib
import signal
import sys
import threading
import time

import psutil
from pyspark import TaskContext
from pyspark.sql import SparkSession

from connector.client import LedgerClient
from connector.spark import LedgerDataSource
from connector.spark.recovery import ATTEMPT_TAG, PARTITION_TAG, STREAM_TAG
from tests.harness.poll import poll_until
from tests.spark.conftest import spark_conf
from tests.spark.helpers import REPO

ROWS = 200_000
HOLD_AT_BATCH = 10  # of 1000 rows: Spark passes all but the last batch or two on to the writer
HOLD_SECONDS = 240  # the longest the first attempt waits to be killed (CI's two loaded cores start executors slowly)
seen: list = []  # each change of (ledger, closed, LAC) the killer saw, with seconds since it started: told if the kill never lands


def hold_first_attempt(pid_file: str, marker: str):
    def run(batches):
        context = TaskContext.get()
        first_attempt = context.partitionId() == 0 and context.attemptNumber() == 0
        if first_attempt:
            executor = next(p for p in psutil.Process().parents() if "CoarseGrainedExecutorBackend" in " ".join(p.cmdline()))
            pathlib.Path(pid_file + ".tmp").write_text(str(executor.pid))
            os.replace(pid_file + ".tmp", pid_file)
        for index, batch in enumerate(batches):
            if first_attempt and index == HOLD_AT_BATCH:
                poll_until(lambda: os.path.exists(marker), HOLD_SECONDS, what="the executor to be killed")
            yield batch
    return run


def kill_while_writing(uri: str, stream: str, pid_file: str, marker: str) -> None:
    others: set[int] = set()  # ledgers of other writers (tags never change): not read again
    started = time.monotonic()

    with LedgerClient(uri) as lc:
        def writing_ledger():
            for ledger_id in set(lc.list_ledgers()) - others:
                custom = lc.ledger_metadata(ledger_id).custom
                if (custom.get(STREAM_TAG), custom.get(PARTITION_TAG), custom.get(ATTEMPT_TAG)) != (stream, "0", "0"):
                    others.add(ledger_id)
                    continue
                handle = lc.open_ledger(ledger_id, recover=False)
                state = (ledger_id, handle.is_closed, handle.last_entry_id)
                if not seen or seen[-1][1:] != state:
                    seen.append((round(time.monotonic() - started, 1), *state))
                # in a tuple: the namespace's first ledger is ledger 0, which poll_until would take for "not yet"
                return (ledger_id,) if not handle.is_closed and handle.last_entry_id >= 0 else None
            return None

        (ledger_id,) = poll_until(lambda: os.path.exists(pid_file) and writing_ledger(), HOLD_SECONDS + 60,
                                  what="partition 0 writing")
        os.kill(int(pathlib.Path(pid_file).read_text()), signal.SIGKILL)
        pathlib.Path(marker).write_text(str(ledger_id))


def main(uri: str, stream: str, marker: str) -> None:
    builder = spark_conf(SparkSession.builder.appName("executor-kill"), "local-cluster[2,1,1024]")
    spark = (
        builder.config("spark.executor.memory", "512m")
        .config("spark.executorEnv.PYTHONPATH", str(REPO))  # executors unpickle this module's functions
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
        .getOrCreate()
    )
    spark.dataSource.register(LedgerDataSource)
    pid_file = marker + ".pid"
    killer = threading.Thread(target=kill_while_writing, args=(uri, stream, pid_file, marker), daemon=True)
    killer.start()
    df = spark.range(0, ROWS, numPartitions=4).selectExpr("id", "sha2(cast(id as string), 256) AS h")
    df = df.mapInArrow(hold_first_attempt(pid_file, marker), df.schema)
    df.write.format("ledger").mode("append").option("metadata", uri).option("entryBytes", "8192").save(stream)
    killer.join(10)
    spark.stop()
    print(f"the killer saw (seconds, ledger, closed, LAC): {seen}", file=sys.stderr)
    if not os.path.exists(marker):
        sys.exit(f"the write finished before its executor could be killed; seen (seconds, ledger, closed, LAC): {seen}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
