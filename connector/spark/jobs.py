"""Task registries: every ledger a Spark write task creates is named in its write job's or streaming
query's registry before it exists, so the driver's sweep reads that registry only, never every ledger of
the cluster (DESIGN rule 15), and still no task ledger can slip past it.

    /spark-jobs/<job id>                       a batch write job (prepare() starts it, commit/abort end it)
    /spark-jobs/<job id>/L0000000042           a task ledger of the job
    /spark-queries/<query id>/L0000000042-B7   a task ledger of micro-batch 7 of a streaming query
    /spark-queries/<query id>/run-<driver>     a run of the query, by that driver

A task allocates a ledger id and registers it (creates its entry, in a multi that checks the registry is
at version 0: a batch job that ended, its version bumped, takes no more entries); only then does it
create the ledger, in a multi that checks the entry is at version 0 (MetadataStore.create_ledger_guarded).
The sweep drops an entry by fencing it (bumping its version), then discarding the ledger if it exists,
then deleting the entry. So a ledger exists only if its entry did first, and once its entry is fenced,
the ledger either exists already (the sweep's read, after its own fence, sees it) or can never be
created: an entry without a ledger (a task that died before creating it, or is not there yet) is safe
to drop. Entries of committed ledgers are deleted once the commit landed, so a registry holds the
ledgers of the job or micro-batch in flight, never the query's history.

Each registry names the driver that runs it (driver.py: a ZooKeeper ephemeral that lives as long as the
driver's JVM), so that the janitor (janitor.py) can tell a registry whose driver is gone from one whose
driver is only slow: a job's znode holds {"stream", "started", "driver"} (and "ended", "fenced", "committed" once
the job's end, a janitor's fence, its commit's multi stamp it); a query, which several runs (a restart, possibly in
another driver) share, holds one child per run, `run-<driver>` = {"stream", "driver", "started", "run"} (the run's
id, new when a fenced run is restarted; and "fenced" once a janitor fences it). Run children do not change the
query znode's version, which its tasks check.
"""
from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import TYPE_CHECKING, Callable, Iterable

from kazoo.exceptions import BadVersionError, NoNodeError, NotEmptyError

from metadata import layout
from metadata.errors import LedgerError, MetadataConflictError, MetadataError
from metadata.model import Versioned
from metadata.store import MetadataStore
from metadata.update_loop import update_record

if TYPE_CHECKING:   # the driver keeper imports this module for driver_in_use: it needs no storage client
    from connector.client import LedgerClient, WriteHandle
    from metadata.streams import ZnodeWrite


RUN_PREFIX = "run-"  # a query registry's child naming a run of the query (task entries start with "L")


class WriteJobEndedError(LedgerError):
    """The task belongs to a write job or micro-batch that was committed or aborted already (a late or
    speculative attempt): it may not create a ledger any more."""


@dataclasses.dataclass(frozen=True)
class TaskRegistry:
    """Where a task registers its ledger: a write job's znode, or a streaming query's with the micro-batch.
    reopen(store): for a query's, records the task's run again when a janitor removed the registry (see
    register_task_ledger)."""

    path: str
    batch: int | None = None
    reopen: Callable[[MetadataStore], object] | None = dataclasses.field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        owner = self.path.rsplit("/", 1)[1]
        return f"write job {owner}" if self.batch is None else f"micro-batch {self.batch} of streaming query {owner}"


@dataclasses.dataclass(frozen=True, order=True)
class TaskEntry:
    """A registered task ledger: the registry's path, the ledger id allocated for it, its micro-batch."""

    registry: str
    ledger_id: int
    batch: int | None = None

    @property
    def path(self) -> str:
        name = layout.ledger_path(self.ledger_id).rsplit("/", 1)[1]
        return f"{self.registry}/{name}" if self.batch is None else f"{self.registry}/{name}-B{self.batch}"

    @classmethod
    def parse(cls, registry: str, name: str) -> "TaskEntry":
        ledger, _, batch = name.partition("-B")
        return cls(registry, layout.ledger_id_from_name(ledger), int(batch) if batch else None)


def job_registry(job_id: str) -> TaskRegistry:
    return TaskRegistry(f"{layout.SPARK_JOBS}/{job_id}")


def query_registry(query_id: str, batch: int | None = None,
                   reopen: Callable[[MetadataStore], object] | None = None) -> TaskRegistry:
    return TaskRegistry(f"{layout.SPARK_QUERIES}/{query_id}", batch, reopen)


# -- driver ------------------------------------------------------------------------------------------

def start_job(store: MetadataStore, job_id: str, stream: str, driver: str = "") -> None:
    """Create the job's registry, naming its stream and the driver whose liveness the janitor checks."""
    data = json.dumps({"stream": stream, "started": time.time(), "driver": driver}).encode()
    store.create_unless_there(job_registry(job_id).path, data)


def end_job(store: MetadataStore, job_id: str, fence: bool = False) -> int | None:
    """From here on no task of the job registers a ledger: the job znode leaves version 0 (tasks check it).
    fence (a janitor's, before it deletes anything): nor does the job's commit land, which checks in its multi that
    the znode is not fenced, at the version it read (commit_guard). None if the registry is gone (removed: by the
    job's driver, or by another janitor, which decided the job's outcome)."""
    now = time.time()
    return _stamp(store, job_registry(job_id).path, f"the registry of write job {job_id}",
                  {"ended": now, "fenced": now} if fence else {"ended": now})


def fence_run(store: MetadataStore, query_id: str, driver: str, run: str) -> int | None:
    """A janitor's fence on the run `run` (its id) of a query whose driver is gone, before it discards the run's
    ledgers: no commit of the run registers a ledger from here on (commit_guard). The fenced run's version
    (forget_run removes that one only), None if that run is gone: removed, or replaced by a new run of the driver,
    back meanwhile, which is not to be fenced."""
    return _stamp(store, run_path(query_id, driver), f"run {driver} of streaming query {query_id}",
                  {"fenced": time.time()}, only=lambda fields: fields.get("run", "") == run)


def _stamp(store: MetadataStore, path: str, what: str, stamps: dict[str, float],
           only: Callable[[dict], bool] = lambda fields: True) -> int | None:
    """Add the stamps a registry znode lacks ("ended", "fenced"), keeping those it has: a compare-and-set (the
    store's update loop), so that a driver's end read before a janitor's fence and written after it cannot take the
    fence away, and a stamp whose reply was lost is read back (rule 16), not failed. Returns the znode's version with
    the stamps; None if the znode is gone (removed: ended and fenced for good), or is not the one `only` accepts."""
    def stamped(found: Versioned[dict]) -> dict | None:
        if not only(found.value) or all(key in found.value for key in stamps):
            return None
        return {**stamps, **found.value}   # a stamp there already is kept

    stored = update_record(store, path, lambda: store.read(path, _fields), stamped, _write_fields(store, path, what),
                           what=what)
    return None if stored is None or not only(stored.value) else stored.version


def _write_fields(store: MetadataStore, path: str, what: str) -> Callable[[dict, int], Versioned[dict]]:
    """The compare-and-set of a registry znode's fields (JSON), for the update loop."""
    return lambda fields, version: Versioned(fields, store.compare_and_set(path, json.dumps(fields).encode(), version,
                                                                           what))


def _fields(data: bytes) -> dict:
    try:
        fields = json.loads(data) if data else {}
    except ValueError:
        return {}
    return fields if isinstance(fields, dict) else {}


@dataclasses.dataclass(frozen=True)
class CommitGuard:
    """A job's registry or a query run's znode as a commit registering ledgers read it: its multi checks (or stamps)
    the znode at this version, so that a janitor's fence made after the read fails the multi."""

    path: str
    version: int
    fields: dict

    @property
    def fenced(self) -> bool:
        """By a janitor that found the driver gone: it deletes the ledgers after this stamp."""
        return "fenced" in self.fields

    @property
    def committed(self) -> bool:
        """Stamped by the job's commit, in the multi that registered its ledgers (a read-back finds it)."""
        return "committed" in self.fields

    def check(self) -> ZnodeWrite:
        return self.path, None, self.version

    def stamp_committed(self) -> ZnodeWrite:
        return self.path, json.dumps({**self.fields, "committed": time.time()}).encode(), self.version


def commit_guard(store: MetadataStore, path: str) -> CommitGuard | None:
    """The job's registry (the query run's znode) for a commit registering ledgers; None if it was removed (by a
    janitor, after its fence, or by the job's own end)."""
    found = store.read(path, _fields)
    return None if found is None else CommitGuard(path, found.version, found.value)


@dataclasses.dataclass
class EntryChecks:
    """What a commit's multi checks of the task ledgers it registers: each one's entry is in the registry and not
    withdrawn (at version 0). Every sweep (a janitor's, an abort's, a later batch's) withdraws an entry before it
    deletes the ledger, so a commit with these checks never registers a deleted ledger, whoever swept and whatever
    driver registration it went by. A multi that failed may have failed on them: from the second attempt on,
    `writes` reads the entries (one by one: a conflict on the head is the usual cause) and raises refused()."""

    store: MetadataStore
    registry: TaskRegistry
    ledger_ids: list[int]
    refused: Callable[[], WriteJobEndedError]
    attempts: int = 0

    def writes(self) -> tuple[ZnodeWrite, ...]:
        self.attempts += 1
        paths = [TaskEntry(self.registry.path, ledger_id, self.registry.batch).path for ledger_id in self.ledger_ids]
        if self.attempts > 1 and any(_withdrawn(self.store, path) for path in paths):
            raise self.refused()
        return tuple((path, None, 0) for path in paths)


def _withdrawn(store: MetadataStore, path: str) -> bool:
    stat = store.stat(path)
    return stat is None or stat.version != 0


def remove_job(store: MetadataStore, job_id: str) -> None:
    """Delete an ended job's znode with the entries left in it (those of ledgers the stream holds)."""
    store.delete(job_registry(job_id).path, recursive=True)


def start_query(store: MetadataStore, query_id: str, stream: str = "", driver: str = "") -> str:
    """Create the query's registry unless it exists, and (given a driver) record this run of it. A janitor
    deletes a registry whose runs are all gone, possibly between the two steps: then create it again. Returns
    the run's id (a new run's, or that of the run this driver has recorded already, or recorded by this call's
    create whose reply was lost; "" without a driver)."""
    path = query_registry(query_id).path
    fields = _new_run(stream, driver)
    for _ in range(100):
        store.ensure_path(path)
        if not driver:
            return ""
        try:
            if store.create_unless_there(run_path(query_id, driver), json.dumps(fields).encode()):
                return fields["run"]
        except NoNodeError:
            continue  # deleted by a janitor since ensure_path
        found = run_of(store, query_id, driver)
        if found is not None:
            return found.value.run
    raise LedgerError(f"the registry of streaming query {query_id} kept disappearing; start the query again")


def restart_run(store: MetadataStore, query_id: str, stream: str, driver: str, stale: Versioned[Registration]) -> str:
    """A new run of the query by this driver in place of one a janitor fenced (it found the driver's registration
    gone for a while; the driver is back under the same id, as a keeper is after its session expired). The fenced
    run's commits stay refused (their run id is gone); the new run's can land, so the query is not refused for as
    long as its driver lives. Returns the new run's id (or, the run changed or removed meanwhile, start_query's).
    A compare-and-set on the fenced run's version, by the store's update loop: a lost reply is read back."""
    path, what = run_path(query_id, driver), f"run {driver} of streaming query {query_id}"
    fields = _new_run(stream, driver)

    def replaced(found: Versioned[dict]) -> dict | None:
        if found.value.get("run") == fields["run"] or found.version != stale.version:
            return None   # landed (its reply lost), or changed since the janitor's fence
        return fields

    stored = update_record(store, path, lambda: store.read(path, _fields), replaced, _write_fields(store, path, what),
                           what=what)
    if stored is None or stored.value.get("run") != fields["run"]:
        return start_query(store, query_id, stream, driver)
    return fields["run"]


def _new_run(stream: str, driver: str) -> dict:
    """A new run's znode fields, its id (new) under "run"."""
    return {"stream": stream, "started": time.time(), "driver": driver, "run": uuid.uuid4().hex[:16]}


def run_of(store: MetadataStore, query_id: str, driver: str) -> Versioned[Registration] | None:
    """This driver's run of the query as recorded, None if it has none."""
    return store.read(run_path(query_id, driver), Registration.decode)


def run_path(query_id: str, driver: str) -> str:
    return f"{query_registry(query_id).path}/{RUN_PREFIX}{driver}"


@dataclasses.dataclass(frozen=True)
class Registration:
    """What a job's znode or a query run's says: the stream written and the driver running it ("" if the
    registry predates drivers being recorded)."""

    stream: str = ""
    driver: str = ""
    started: float | None = None
    fenced: bool = False   # by a janitor: the driver was found gone (its ledgers may be deleted)
    run: str = ""          # a query run's id: a new one when a run fenced is restarted ("" before run ids)

    @classmethod
    def decode(cls, data: bytes) -> "Registration":
        fields = _fields(data)
        return cls(str(fields.get("stream") or ""), str(fields.get("driver") or ""), fields.get("started"),
                   bool(fields.get("fenced")), str(fields.get("run") or ""))


def job_ids(store: MetadataStore) -> list[str]:
    return registry_ids(store)[0]


def read_job(store: MetadataStore, job_id: str) -> Registration | None:
    found = store.read(job_registry(job_id).path, Registration.decode)
    return None if found is None else found.value


def query_ids(store: MetadataStore) -> list[str]:
    return registry_ids(store)[1]


def registry_ids(store: MetadataStore) -> tuple[list[str], list[str]]:
    """Every batch write job and every streaming query with a registry (those in flight, and those whose driver
    died: janitor.py), each listing after a sync, in one round trip."""
    jobs, queries = store.synced_children([layout.SPARK_JOBS, layout.SPARK_QUERIES])
    return sorted(jobs), sorted(queries)


def read_jobs(store: MetadataStore, job_ids: list[str]) -> list[Registration | None]:
    """read_job() of each, pipelined."""
    found = store.read_many([job_registry(job_id).path for job_id in job_ids], Registration.decode)
    return [None if one is None else one.value for one in found]


def query_runs(store: MetadataStore, query_id: str) -> dict[str, Registration]:
    """The query's runs by driver (none for a registry written before runs were recorded)."""
    try:
        names = [name for name in store.children(query_registry(query_id).path) if name.startswith(RUN_PREFIX)]
    except NoNodeError:
        return {}
    found = store.read_many([f"{query_registry(query_id).path}/{name}" for name in names], Registration.decode)
    return {name[len(RUN_PREFIX):]: one.value for name, one in zip(names, found) if one is not None}


def forget_run(store: MetadataStore, query_id: str, driver: str, version: int = -1) -> None:
    """Remove the run (at that version only, given one: a fenced run, which its driver may have restarted since)."""
    transaction = store.transaction()
    transaction.delete(run_path(query_id, driver), version)
    try:
        transaction.commit()
    except (BadVersionError, NoNodeError):
        pass   # restarted since (it stays), or removed already


def remove_fenced_runs(store: MetadataStore, query_id: str, runs: dict[str, int]) -> bool:
    """Delete the runs (each at the version given: fenced at, or read when the query was found stopped) and the
    query's registry in one multi, all or none:
    False, and nothing deleted, if a run changed (its driver restarted it) or anything else is in the registry (a
    task of a fenced run registered a ledger meanwhile): the fenced runs then stay, so that the registry still
    names drivers that are gone, and the next janitor looks at it again."""
    transaction = store.transaction()
    for driver, version in runs.items():
        transaction.delete(run_path(query_id, driver), version)
    transaction.delete(query_registry(query_id).path)
    try:
        transaction.commit()
    except (BadVersionError, NoNodeError):
        return False
    except MetadataError as exc:
        if isinstance(exc.__cause__, NotEmptyError):
            return False
        raise
    return True


def remove_query(store: MetadataStore, query_id: str) -> bool:
    """Delete the query's registry if nothing is left in it (no entry, no run); False if something is."""
    try:
        store.delete(query_registry(query_id).path)
    except MetadataError as exc:
        if isinstance(exc.__cause__, NotEmptyError):  # a run started, or a task registered, meanwhile
            return False
        raise
    return True


def driver_in_use(store: MetadataStore, driver: str) -> bool:
    """Whether any registry names the driver: a job it started that is not removed, or a run of a query.
    Reads the registries in flight (and abandoned ones), never the ledgers: the listings in one round trip, then
    the jobs' and the query runs' znodes at once (pipelined)."""
    jobs, queries = registry_ids(store)
    if any(job is not None and job.driver == driver for job in read_jobs(store, jobs)):
        return True
    return any(store.exist([run_path(query_id, driver) for query_id in queries]))


def task_entries(store: MetadataStore, registry: TaskRegistry, through_batch: int | None = None) -> list[TaskEntry]:
    """The registry's entries (for a query: of micro-batches up to through_batch), read after a sync, so that
    every entry registered before the call is seen."""
    store.sync(registry.path)
    try:
        names = store.children(registry.path)
    except NoNodeError:
        return []
    entries = (TaskEntry.parse(registry.path, name) for name in names if not name.startswith(RUN_PREFIX))
    return sorted(e for e in entries if through_batch is None or e.batch <= through_batch)


def drop_entry(lc: LedgerClient, entry: TaskEntry, password: bytes) -> None:
    """Withdraw the entry, discard its ledger (fence, recover, delete) if it exists, then delete the entry."""
    if withdraw(lc.store, entry):
        from connector.spark.recovery import discard   # the storage client, only where a ledger is dropped
        discard(lc, entry.ledger_id, password)
        forget_entry(lc.store, entry)


def settle(store: MetadataStore, entries: list[TaskEntry],
           held_of: Callable[[list[int]], set[int]]) -> tuple[list[TaskEntry], list[TaskEntry]]:
    """Withdraw the entries, then ask held_of which of their ledgers a stream holds: (held, not held), both
    withdrawn (entries gone meanwhile are in neither). In this order the answer is final: a commit checks its
    ledgers' entries at version 0 in its multi, so none registers a withdrawn one, and a stream read after the
    withdraws sees every commit that landed before them (ZooKeeper orders a session's reads after its writes).
    Asked first, a commit by another run of the query (its driver's registration changed mid-batch) could land in
    between, and the sweep would delete a ledger the stream had just taken."""
    withdrawn_now = [entry for entry in entries if withdraw(store, entry)]
    held = held_of([entry.ledger_id for entry in withdrawn_now]) if withdrawn_now else set()
    return ([entry for entry in withdrawn_now if entry.ledger_id in held],
            [entry for entry in withdrawn_now if entry.ledger_id not in held])


def sweep_entries(store: MetadataStore, entries: list[TaskEntry], held_of: Callable[[list[int]], set[int]],
                  discard: Callable[[int], object]) -> tuple[list[int], list[int]]:
    """The one sweep of registry entries (a commit's, an abort's, the janitor's): settle them, forget those of
    ledgers a stream holds, discard (by id; False if there was no ledger to delete) the others' ledgers and then
    forget their entries. Returns (the ledgers kept, those deleted)."""
    held, others = settle(store, entries, held_of)
    for entry in held:
        forget_entry(store, entry)
    deleted = []
    for entry in others:
        if discard(entry.ledger_id) is not False:
            deleted.append(entry.ledger_id)
        forget_entry(store, entry)
    return [entry.ledger_id for entry in held], deleted


def withdraw(store: MetadataStore, entry: TaskEntry) -> bool:
    """Fence the entry (its version leaves 0): its ledger cannot be created from now on. False if the entry is gone
    (dropped already). The first attempt writes without reading (an entry is registered at version 0); a lost reply
    is read back (rule 16)."""
    what = f"task registry entry {entry.path}"

    def withdrawn(found: Versioned[bytes]) -> bytes | None:
        return None if found.version != 0 else b"withdrawn"   # not 0: withdrawn already

    def write(data: bytes, version: int) -> Versioned[bytes]:
        return Versioned(data, store.compare_and_set(entry.path, data, version, what))

    return update_record(store, entry.path, lambda: store.read(entry.path, bytes), withdrawn, write, what=what,
                         current=Versioned(b"", 0)) is not None


def forget_entry(store: MetadataStore, entry: TaskEntry) -> None:
    """Delete the entry: its ledger is on the stream, or gone for good."""
    store.delete(entry.path)


# -- tasks -------------------------------------------------------------------------------------------

def register_task_ledger(store: MetadataStore, registry: TaskRegistry) -> TaskEntry:
    """Allocate a ledger id and name it in the registry, before the ledger exists. A job's registry gone or ended
    refuses it (the job was committed or aborted). A query's registry is never stamped, and one gone was removed by
    a janitor that found the query's driver gone (its ZooKeeper session had expired, or it stopped between
    batches): with registry.reopen, the task records its run again (start_query) and registers then, as the query's
    next start would; a batch whose ledgers the janitor discarded is still refused at its commit. Until 2026-11-29
    every task of the query's next batch was refused, for good: the query died though its driver was back."""
    for attempt in range(2):
        entry = TaskEntry(registry.path, store.allocate_ledger_id(), registry.batch)
        request = store.transaction()
        request.check(registry.path, 0)
        request.create(entry.path)
        try:
            request.commit()
            return entry
        except NoNodeError as exc:   # only the check can fail so: the entry's name is new
            if registry.reopen is None or attempt:
                raise _ended(registry) from exc
            registry.reopen(store)
        except BadVersionError as exc:
            raise _ended(registry) from exc
    raise AssertionError("unreachable")


def _ended(registry: TaskRegistry) -> WriteJobEndedError:
    return WriteJobEndedError(f"{registry} was committed or aborted already; this task attempt wrote nothing")


def create_task_ledger(lc: LedgerClient, entry: TaskEntry, **create) -> WriteHandle:
    """The entry's ledger (create_ledger's arguments in create), unless the sweep withdrew the entry first."""
    try:
        return lc.create_ledger(ledger_id=entry.ledger_id, guard=entry.path, **create)
    except MetadataConflictError as exc:
        raise WriteJobEndedError(
            f"{TaskRegistry(entry.registry, entry.batch)} was committed or aborted already and its sweep withdrew "
            f"task ledger {entry.ledger_id}; this task attempt wrote nothing"
        ) from exc
