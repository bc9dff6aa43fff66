"""Write jobs: a znode per running Spark write job, so no task ledger can slip past the driver's sweep.

A task creates its ledger first and then checks that its job is still running; the driver ends the
job (deletes the znode) before it sweeps the job's ledgers at commit or abort. Either the sweep sees
the task's ledger, or the task sees the job ended and deletes its own ledger.
"""
from __future__ import annotations

import json
import time

from kazoo.exceptions import NodeExistsError, NoNodeError

from metadata import layout
from metadata.errors import LedgerError
from metadata.store import MetadataStore



class WriteJobEndedError(LedgerError):
    """The task belongs to a write job that was committed or aborted already (a late or speculative attempt)."""


def _path(job_id: str) -> str:
    return f"{layout.SPARK_JOBS}/{job_id}"


def start_job(store: MetadataStore, job_id: str, stream: str) -> None:
    store._call(store.zk.ensure_path, layout.SPARK_JOBS)
    try:
        store._call(store.zk.create, _path(job_id), json.dumps({"stream": stream, "started": time.time()}).encode())
    except NodeExistsError:
        pass


def end_job(store: MetadataStore, job_id: str) -> None:
    try:
        store._call(store.zk.delete, _path(job_id))
    except NoNodeError:
        pass


def check_job_running(store: MetadataStore, job_id: str) -> None:
    # sync: a follower must not answer from before the driver ended the job.
    store._call(store.zk.sync, _path(job_id))
    if store._call(store.zk.exists, _path(job_id)) is None:
        raise WriteJobEndedError(
            f"write job {job_id} was committed or aborted already; this task attempt's ledger was deleted"
        )
