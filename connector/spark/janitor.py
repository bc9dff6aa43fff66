"""The janitor: the ledgers of Spark write jobs and streaming queries whose driver is gone.

A driver that dies in the middle of a write (Ctrl-C, SIGKILL, a lost machine) leaves its job's registry
(jobs.py) and the task ledgers named there; nothing else would ever remove them. Every registry names its
driver, whose liveness is an ephemeral znode held for exactly as long as the driver's JVM lives (driver.py).
The janitor looks only at the registries (O(jobs and queries in flight or abandoned), never at every ledger
of the cluster: rule 15) and cleans those whose drivers are all gone:

1. a batch job's registry (a streaming query's run) is fenced: it is stamped so, which no task registering a
   ledger and no commit registering ledgers gets past (each checks the znode's version in its multi); then the
   job is recorded aborted on its stream in a CAS of its own, unless its commit landed first (rule 16: the
   commit may have landed just before the driver died); a query's run is recorded aborted as
   `<query id>@<driver>`. So no commit of the gone driver can land from here on, even if the driver was in
   fact only cut off from ZooKeeper long enough for its session to end, and even if this janitor dies before
   it removes the registry while more jobs end on the stream than its head keeps outcomes of: the commit
   fails cleanly instead of registering ledgers deleted under it;
2. the entries of ledgers the stream holds (committed just before the driver died) are only forgotten;
   every other ledger is fenced and recovered if it is OPEN, then deleted, then its entry;
3. the registry is removed (a query's only if nothing else is in it: a new run may be starting).

A registry whose driver is alive is never touched, however slow or paused the driver is. Registries
written before drivers were recorded name none: they are reported, and cleaned only on request (legacy).

It runs at the start of every write job and streaming query, for the stream written (clean_stream), and as
`ledger jobs --apply` for the whole cluster.
"""
from __future__ import annotations

import dataclasses
import logging
import random
from typing import Iterable, Sequence

from connector.client import LedgerClient, NoSuchLedgerError
from connector.compaction import clean_compactions
from connector.retention import clean_cuts
from connector.spark.commit import COMMITTED, aborted_job, job_outcome
from connector.spark.jobs import (
    Registration, TaskEntry, commit_guard, end_job, fence_run, forget_run, job_registry, query_registry, query_runs,
    read_job, read_jobs, registry_ids, remove_fenced_runs, remove_job, run_path, sweep_entries, task_entries,
)
from connector.spark.recovery import STREAM_TAG, check_password, recover
from metadata import layout, registry
from metadata.errors import LedgerError, NoSuchStreamError
from metadata.model import LedgerMetadata, StreamRecord
from metadata.store import MetadataStore
from metadata.streams import InvalidStreamNameError, check_stream_name, held_by_streams, update_stream
from protos.digest import password_hash

log = logging.getLogger(__name__)

JOB = "job"
QUERY = "query"
RUNNING = "running"      # a driver of it is alive: never touched
ABANDONED = "abandoned"  # every driver it names is gone
UNKNOWN = "unknown"      # it names no driver (written before drivers were recorded)


class PasswordNeededError(LedgerError):
    """An OPEN ledger must be fenced before it is deleted, and that takes its password."""


STOPPED_QUERIES_PER_START = 16   # registries of other streams' stopped queries a start removes at most
STOPPED_QUERIES_LOOKED_AT = 64   # and looks at (a listing of the entries each), in random order
ABANDONED_ELSEWHERE_PER_START = 1   # abandoned registries of other streams a start cleans (ledgers and all)


def run_key(query_id: str, driver: str, run: str = "") -> str:
    """How a run of a streaming query is recorded aborted among the stream's job outcomes (run: its id, "" for a
    run recorded before runs had ids)."""
    return f"{query_id}@{driver}/{run}" if run else f"{query_id}@{driver}"


@dataclasses.dataclass(frozen=True)
class Registry:
    """A job's or query's registry as the janitor sees it: its runs (a job has one) and which drivers live."""

    kind: str
    owner: str
    runs: dict[str, Registration]
    alive: frozenset[str]
    stream_of_job: str = ""  # a job's stream, known even when no driver is recorded

    @property
    def state(self) -> str:
        if self.alive:
            return RUNNING
        return ABANDONED if self.drivers else UNKNOWN

    @property
    def drivers(self) -> list[str]:
        return sorted(driver for driver in self.runs if driver)

    @property
    def streams(self) -> list[str]:
        return sorted({run.stream for run in self.runs.values() if run.stream} | ({self.stream_of_job} - {""}))

    @property
    def path(self) -> str:
        return (job_registry(self.owner) if self.kind == JOB else query_registry(self.owner)).path

    def entries(self, store: MetadataStore) -> list[TaskEntry]:
        return task_entries(store, job_registry(self.owner) if self.kind == JOB else query_registry(self.owner))


@dataclasses.dataclass(frozen=True)
class LedgerFacts:
    ledger_id: int
    state: str
    bytes: int     # of a closed ledger; 0 for an OPEN one (known only once it is recovered)
    replicas: int  # copies of each entry (write quorum)


@dataclasses.dataclass
class Cleaned:
    """What cleaning one registry did."""

    registry: Registry
    deleted: list[int] = dataclasses.field(default_factory=list)  # ledgers fenced and deleted
    kept: list[int] = dataclasses.field(default_factory=list)     # ledgers a stream holds: committed
    skipped: str = ""   # why the registry was left as it is (a driver came back, ...)
    error: str = ""     # why cleaning stopped part-way (the next run goes on from there)


# -- finding -------------------------------------------------------------------------------------------


def find_registries(store: MetadataStore, stream: str | None = None) -> list[Registry]:
    """Every job and query registry (those of one stream, given one), with the liveness of its drivers.
    Reads the registries and one liveness znode per driver, nothing else."""
    jobs, queries = registry_ids(store)   # the listings, the job registries, and the drivers' liveness: pipelined
    found = []
    for job_id, job in zip(jobs, read_jobs(store, jobs)):
        if job is None or (stream is not None and job.stream != stream):
            continue
        found.append((JOB, job_id, {job.driver: job}, job.stream))
    for query_id in queries:
        runs = query_runs(store, query_id)
        if stream is not None and not any(run.stream == stream for run in runs.values()):
            continue
        found.append((QUERY, query_id, runs, ""))
    alive = registry.writers_alive(store, (driver for _, _, runs, _ in found for driver in runs))
    return [Registry(kind, registry_id, runs, frozenset(alive.intersection(runs)), stream_of_job=stream_of_job)
            for kind, registry_id, runs, stream_of_job in found]


def ledger_facts(store: MetadataStore, entries: Iterable[TaskEntry]) -> list[LedgerFacts]:
    """The ledgers of the entries that exist (an entry may have none: its task died before creating it)."""
    facts = []
    for entry in entries:
        try:
            meta = store.read_ledger(entry.ledger_id).value
        except NoSuchLedgerError:
            continue
        facts.append(LedgerFacts(meta.ledger_id, meta.state.value, meta.length if meta.is_closed else 0,
                                 meta.write_quorum))
    return facts


# -- cleaning ------------------------------------------------------------------------------------------


def clean_stream(lc: LedgerClient, stream: str, password: bytes, own_query: str = "") -> list[Cleaned]:
    """At the start of a write job or streaming query on stream: clean the stream's abandoned registries, and
    remove up to STOPPED_QUERIES_PER_START registries of queries on other streams whose drivers are gone and that
    hold no task entries. Those are what a query leaves when it stops (its runs; each batch's entries are swept as
    it commits). Nothing else removes them while no job starts on their stream, and every driver keeper reads
    every registry every 10 s: a cluster where queries come and go would pay for every query it ever ran.
    own_query: the streaming query starting (a run of it in this driver): its registry is left to its own sweeps,
    which discard what its gone runs left once they commit or abort a batch past it. A driver whose registration
    changed (its keeper died, its session expired) starts a run again under the new one, and must not discard the
    batch in flight that its commit is about to register.
    Never raises (the job goes on; what is left, the next start or `ledger jobs --apply` cleans)."""
    try:   # an overwrite (or a truncation) whose process died before its deletes: one listing, none left usually
        if finished := clean_cuts(lc, stream, password=password):
            log.info("stream %r: %d cuts whose process died before deleting their ledgers finished", stream, finished)
    except LedgerError as exc:
        log.warning("stream %r: cuts of processes that died not finished: %s", stream, exc)
    try:   # a compaction run without --wait and never again: its replaced ledgers went only at the next compaction
        done = clean_compactions(lc, stream, password=password)
        if done.finished or done.abandoned:
            log.info("stream %r: %d compactions past their grace finished, %d of gone processes undone", stream,
                     len(done.finished), len(done.abandoned))
    except LedgerError as exc:
        log.warning("stream %r: compactions past their grace not finished: %s", stream, exc)
    try:
        found = [f for f in find_registries(lc.store) if f.state == ABANDONED]
    except LedgerError as exc:
        log.warning("stream %r: abandoned Spark jobs not looked for: %s", stream, exc)
        return []
    cleaned = [clean(lc, f, [password], patient=False) for f in found
               if stream in f.streams and not (f.kind == QUERY and f.owner == own_query)]
    for outcome in cleaned:
        if outcome.error:
            log.warning("stream %r: %s %s of a gone driver not cleaned: %s", stream, outcome.registry.kind,
                        outcome.registry.owner, outcome.error)
        elif not outcome.skipped:
            log.info("stream %r: %s %s of a gone driver cleaned: %d ledgers deleted, %d committed kept", stream,
                     outcome.registry.kind, outcome.registry.owner, len(outcome.deleted), len(outcome.kept))
    # In random order, so that registries this cannot remove (a query's driver died with task ledgers left,
    # which its own stream's next start discards) do not take every start's turn.
    stopped = [f for f in found if f.kind == QUERY and stream not in f.streams]
    removed, stopped_removed = 0, set()
    for query in random.sample(stopped, min(len(stopped), STOPPED_QUERIES_LOOKED_AT)):
        if removed == STOPPED_QUERIES_PER_START:
            break
        try:
            if remove_stopped_query(lc.store, query):
                removed += 1
                stopped_removed.add(query.owner)
                log.info("query %s on %s: stopped and its driver gone, its registry removed", query.owner,
                         ", ".join(map(repr, query.streams)))
        except LedgerError as exc:
            log.info("query %s: registry not removed (the next start tries again): %s", query.owner, exc)
    # Abandoned registries that hold task entries, of streams no job may ever start on again (a notebook's write
    # to a scratch stream killed mid-job, a query killed mid-batch): cleaned by their stream's next start, or
    # `ledger jobs --apply`, else kept for good, and every start and keeper reads every registry. A start cleans
    # one of them too, with its own password (one whose ledgers have another is left for `ledger jobs --apply`).
    elsewhere = [f for f in found if stream not in f.streams and (f.kind == JOB or f.owner not in stopped_removed)]
    for other in random.sample(elsewhere, min(len(elsewhere), ABANDONED_ELSEWHERE_PER_START)):
        if not _password_fits(lc, other, password):
            continue      # not fenced and left half cleaned: its OPEN ledgers take another password
        outcome = clean(lc, other, [password], patient=False)
        if outcome.error:
            log.info("%s %s of a gone driver on %s not cleaned: %s", other.kind, other.owner,
                     ", ".join(map(repr, other.streams)), outcome.error)
        elif not outcome.skipped:
            log.info("%s %s of a gone driver on %s cleaned: %d ledgers deleted, %d committed kept", other.kind,
                     other.owner, ", ".join(map(repr, other.streams)), len(outcome.deleted), len(outcome.kept))
    return cleaned


def _password_fits(lc: LedgerClient, found: Registry, password: bytes) -> bool:
    """Whether the registry's OPEN ledgers, which are fenced and recovered before they are deleted, take this
    password (a closed ledger is deleted without one): the first of them tells, as the ledgers of one job or
    query share their stream's password."""
    try:
        for entry in found.entries(lc.store):
            try:
                meta = lc.store.read_ledger(entry.ledger_id).value
            except NoSuchLedgerError:
                continue
            if not meta.is_closed:
                check_password(meta, password, f"the ledgers of {found.kind} {found.owner}")
                return True
    except LedgerError:      # UnauthorizedError too
        return False
    return True


def retire_gone_runs(store: MetadataStore, query_id: str, starting: str) -> int:
    """At the start of a run of the query (by driver `starting`): its other runs whose drivers are gone are fenced,
    recorded aborted and removed, as a janitor would once the whole query was abandoned. Their task entries are left
    to the query's sweeps, which discard what no stream holds. A running query's registry is never abandoned, so
    without this a query restarted once a day would hold a run per restart, read by every job start's janitor.
    Returns how many it retired."""
    gone = {driver: run for driver, run in query_runs(store, query_id).items()
            if driver and driver != starting and not registry.writer_alive(store, driver)}
    for driver, run in gone.items():
        version = _fence_run(store, query_id, driver, run)
        if version is not None:
            forget_run(store, query_id, driver, version)
    return len(gone)


def _fence_run(store: MetadataStore, query_id: str, driver: str, run: Registration) -> int | None:
    """Fence a run of a gone driver and record it aborted on its stream: from here on no commit of it lands. The
    fenced run's version, for forget_run; None if the run is gone or was replaced by a new run (its driver is back)."""
    version = fence_run(store, query_id, driver, run.run)
    if run.stream:
        record_aborted(store, run.stream, run_key(query_id, driver, run.run))
    return version


def remove_stopped_query(store: MetadataStore, found: Registry) -> bool:
    """Remove the registry of a query whose drivers are gone and that holds no task entries: its runs, then the
    registry (kept if an entry was registered meanwhile). Its runs are not recorded aborted, as _clean_query does
    before it discards a query's ledgers: there are none to discard. A driver that was only away for a moment (its
    ZooKeeper session expired) records its run again with its next batch; a batch of the removed run that commits
    ledgers is refused (a run's absence fences such a commit, stream_write._run_fenced), an empty one is not.
    Whether it removed the registry."""
    if found.entries(store) or any(registry.writer_alive(store, driver) for driver in found.drivers):
        return False
    # The runs at the versions read now and the registry, all or none: a task that registers meanwhile keeps them
    # all (the runs were forgotten one by one before, leaving a registry with an entry and no run, UNKNOWN to every
    # janitor but `ledger jobs --apply --legacy`).
    read = store.read_many([run_path(found.owner, driver) for driver in found.runs], bytes)
    return remove_fenced_runs(store, found.owner,
                              {driver: run.version for driver, run in zip(found.runs, read) if run is not None})


def clean(lc: LedgerClient, found: Registry, passwords: Sequence[bytes], legacy: bool = False,
          patient: bool = True) -> Cleaned:
    """Clean one registry whose drivers are gone (or, with legacy, that names none). Never raises: a failure
    is in the result's error, and the registry stays for the next run, which goes on from there. patient:
    retry the recovery of an OPEN ledger while nodes are missing (not at a job's start, which must not wait)."""
    outcome = Cleaned(found)
    sweep = Sweep(lc, passwords, patient, outcome)
    try:
        if found.kind == JOB:
            _clean_job(lc, found, legacy, sweep)
        else:
            _clean_query(lc, found, legacy, sweep)
    except LedgerError as exc:
        outcome.error = str(exc)
    return outcome


def _clean_job(lc: LedgerClient, found: Registry, legacy: bool, sweep: "Sweep") -> None:
    store = lc.store
    job = read_job(store, found.owner)
    if job is None:
        sweep.outcome.skipped = "removed meanwhile (its driver ended it)"
        return
    if not _may_clean(store, {job.driver: job}, legacy, sweep.outcome):
        return
    if end_job(store, found.owner, fence=True) is None:  # from here on no task registers a ledger, nor commit lands
        sweep.outcome.skipped = "removed meanwhile (its driver or another janitor ended it)"
        return
    guard = commit_guard(store, job_registry(found.owner).path)
    if guard is None:   # another janitor decided the job's outcome and removed the registry since the fence
        sweep.outcome.skipped = "removed meanwhile (another janitor ended it)"
        return
    stamped = guard.committed   # it landed, whether or not the head still holds its outcome
    if stamped or (bool(job.stream) and _recorded_committed(store, job.stream, found.owner)):   # rule 16
        log.info("write job %s: its commit had landed on stream %r before its driver died", found.owner, job.stream)
    sweep(found.entries(store), [job.stream] if job.stream else [])
    remove_job(store, found.owner)


def _recorded_committed(store: MetadataStore, stream: str, job_id: str) -> bool:
    """Record the job aborted on the stream unless it committed; whether it had committed."""
    record = record_aborted(store, stream, job_id)
    return record is not None and job_outcome(record, job_id) == COMMITTED


def _clean_query(lc: LedgerClient, found: Registry, legacy: bool, sweep: "Sweep") -> None:
    """Another run of the query may start while this runs (its driver's registration changed mid-batch, and the run
    under the new one commits the batch the gone run wrote): that is why the sweep asks which ledgers a stream holds
    only after it withdrew their entries."""
    store = lc.store
    entries = found.entries(store)
    runs = query_runs(store, found.owner)
    if not _may_clean(store, runs, legacy, sweep.outcome):
        return
    # From here on no commit of these runs registers a ledger (the next run is not among them).
    fenced = {driver: _fence_run(store, found.owner, driver, run) for driver, run in runs.items()}
    names = {run.stream for run in runs.values() if run.stream}
    sweep(entries, sorted(names))
    # A fence stops a run's commits, not its tasks: one may have registered a ledger since the listing. The runs and
    # the registry go in one multi, which fails if the registry holds anything else (or a run was restarted).
    done = {driver: version for driver, version in fenced.items() if version is not None}
    if remove_fenced_runs(store, found.owner, done):
        return
    if not store.exists(found.path):
        sweep.outcome.skipped = "removed meanwhile (another janitor ended it)"
    elif any(registry.writer_alive(store, driver) for driver in query_runs(store, found.owner)):
        sweep.outcome.skipped = "a driver of it is back (it restarted its run): its sweeps go on"
    else:
        sweep.outcome.error = ("its registry changed meanwhile (a task registered a ledger, or a run was restarted); "
                               "the next janitor looks again")


def _may_clean(store: MetadataStore, runs: dict[str, Registration], legacy: bool, outcome: Cleaned) -> bool:
    """Looked at again just before anything changes: no driver of it may be alive."""
    drivers = [driver for driver in runs if driver]
    if any(registry.writer_alive(store, driver) for driver in drivers):
        outcome.skipped = "its driver is alive"
        return False
    if not drivers and not legacy:
        outcome.skipped = "it names no driver (written by an older version); clean it with --legacy"
        return False
    return True


def record_aborted(store: MetadataStore, stream: str, key: str) -> StreamRecord | None:
    """Record key (a job, or a query's run) aborted on the stream unless it committed, so that no commit of
    it lands from now on (the CAS bumps the stream's version: a commit in flight re-reads and finds it).
    Sync first (rule 16), so a commit that landed before is seen. The stream as stored then; None if the
    stream is gone (no commit can land on it either). Used by the janitor and by a job's own abort."""
    try:
        store.sync(layout.stream_path(stream))
        return update_stream(store, stream, lambda record: aborted_job(record, key), read_back=True).value
    except NoSuchStreamError:
        return None


def held_by_their_streams(store: MetadataStore, streams: Iterable[str], ledger_ids: list[int]) -> set[int]:
    """Which of the ledgers a stream holds: one of streams, or the one each ledger was written for (its STREAM_TAG).
    A query's registry may hold ledgers of several streams: restarted from its checkpoint with another path, a
    query goes on under the same id (Kafka's sink writes the next batches to the new topic), and a copied
    checkpoint's query may write elsewhere; a registry of an older version names no run, hence no stream at all.
    Asked only the stream it writes now (or its run recorded), a sweep deleted the ledgers another stream holds:
    committed rows, their offsets then unreadable. Asked after settle withdrew the entries, so no ledger of them is
    created later: the tags read are all there are. O(entries swept): a read of each one's metadata."""
    names = set(streams)
    for ledger_id in ledger_ids:
        try:
            names.add(store.read_ledger(ledger_id).value.custom.get(STREAM_TAG))
        except NoSuchLedgerError:
            continue
    return held_by_streams(store, sorted(name for name in names if name and _is_stream_name(name)), ledger_ids)


def _is_stream_name(name: object) -> bool:
    try:
        check_stream_name(name)
    except InvalidStreamNameError:
        return False
    return True


@dataclasses.dataclass
class Sweep:
    """Goes through a registry's entries: forgets those of ledgers a stream holds, drops the others."""

    lc: LedgerClient
    passwords: Sequence[bytes]
    patient: bool
    outcome: Cleaned

    def __call__(self, entries: list[TaskEntry], streams: list[str]) -> None:
        """streams: those that may hold the entries' ledgers (committed just before the driver died), besides the
        ones their ledgers were written for (held_by_their_streams)."""
        kept, deleted = sweep_entries(self.lc.store, entries,
                                      lambda ids: held_by_their_streams(self.lc.store, streams, ids), self._discard)
        self.outcome.kept += kept
        self.outcome.deleted += deleted

    def _discard(self, ledger_id: int) -> bool:
        """Fence and recover the ledger if it is OPEN (its writer may be a task that is only paused), then
        delete it. False if it does not exist."""
        try:
            meta = self.lc.ledger_metadata(ledger_id)
        except NoSuchLedgerError:
            return False
        if not meta.is_closed:
            password = _password_of(meta, self.passwords)
            if self.patient:
                recover(self.lc, ledger_id, password)
            else:
                self.lc.recover_ledger(ledger_id, password)
        try:
            self.lc.delete_ledger(ledger_id)
        except NoSuchLedgerError:
            return False
        return True


def _password_of(meta: LedgerMetadata, passwords: Sequence[bytes]) -> bytes:
    for password in passwords:
        if not meta.password_hash or password_hash(password) == meta.password_hash:
            return password
    raise PasswordNeededError(
        f"ledger {meta.ledger_id} is OPEN and must be fenced before it is deleted, which takes its password: "
        "give it with --password (repeat for several)"
    )
