"""The Spark driver's liveness in ZooKeeper: an ephemeral znode that lives exactly as long as the driver.

A write job's or streaming query's registry (jobs.py) names the driver that runs it, so that the janitor
(janitor.py) can tell a registry whose driver is gone (its ledgers are left over for good) from one whose
driver is only slow (never touched). The driver's Python code, though, does not run in one process: Spark
calls prepare() and commit() in pooled Python workers that it starts and stops as it likes (idle ones
after a minute), so no session of theirs lasts the job. What lasts it is the driver's JVM. So:

- the driver process is the nearest process, from this one up, that is not one of Spark's Python workers
  (their command lines run a `pyspark.` module): the JVM when prepare() runs inside Spark, or this very
  process when the writer is driven directly (tests, benchmarks);
- this very process holds the registration itself, on a session of its own, for as long as it lives;
- otherwise a keeper process (`python -m connector.spark.driver_keeper`, started in a session of its own so that a
  Ctrl-C or SIGSTOP meant for the driver's process group does not reach it) holds it, and deletes it and
  exits as soon as the JVM is gone. A paused or overloaded JVM still exists: its keeper goes on, and
  nothing of it is touched.

One registration serves every job and query of one driver on one metadata root. It ends when the driver
is gone, or when no registry has named it for IDLE_SECONDS (checked under a lock that the job start holds
while it creates its registry, so a registration never ends under a job that is being started).

A keeper's start (a Python process and a ZooKeeper session, about 0.15 s) is on the path of a driver's first
job, so a job start begins it ahead (keeper_started_ahead), before its checks, and waits for its registration
only where it names the driver; the wait wakes on a ZooKeeper watch of the registration. A keeper started
ahead for a job start that then fails is stopped.

A keeper's files (KeeperFiles: state, lock, log, in one directory per user) go with it: it removes them as it
ends (driver gone, idle, stopped by a signal), and whoever stops a keeper it started removes them under the lock.
Those a killed or crashed keeper left (a failed start keeps its log, which the error names) are removed by a
later keeper's start once their driver process is gone (sweep_gone_drivers: a bounded number per start).
That directory has a predictable name in the shared temporary directory, so another local user could make it
first, or plant links in it, to read or overwrite what a driver writes there: it is used only if it is a real
directory of this user's that no one else may enter (private_keeper_directory), and its files are never opened
through a link. The metadata root's part of their names is a hash of the URI with its secret redacted, since
the names are on the keeper's command line for everyone to see. (Not $XDG_RUNTIME_DIR: it goes away when its
user's last session ends, under a driver that outlives the session.)

The registration is a liveness signal, not the safety: a driver whose registration ended by mistake (its
keeper killed, its session expired) may still commit; the janitor fences it on the stream before it deletes
anything (janitor.py), and that commit then fails cleanly.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import pathlib
import random
import re
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Iterator

import psutil

from connector.spark.jobs import driver_in_use
from metadata import registry
from metadata.errors import LedgerError
from metadata.store import METADATA_ENV, MetadataStore, redact_uri

log = logging.getLogger(__name__)

IDLE_SECONDS = 60.0        # a registration no registry has named for this long ends
WATCH_INTERVAL = 0.5       # seconds between a keeper's looks at the driver process
KEEPER_START_SECONDS = 60.0  # how long a job start waits for a new keeper's registration to appear
KEEPER_MODULE = "connector.spark.driver_keeper"
SWEEP_DRIVERS = 64         # drivers' files a keeper's start looks at, at most, to remove those of gone drivers
STOP_LOCK_SECONDS = 5.0    # how long a keeper stopped by a signal waits for the lock to remove its files
# KeeperFiles names: <driver pid>-<driver start time, ms>-<metadata root hash>.<suffix>
_KEEPER_FILE = re.compile(r"(\d+)-(\d+)-[0-9a-f]{16}\.(?:json|lock|log|tmp)")
_WORKER_MODULE = "pyspark."  # Spark's Python workers and daemons run `python -m pyspark.<module>`


class DriverRegistrationError(LedgerError):
    """The driver's liveness could not be registered in ZooKeeper, so no write job may start."""


@dataclasses.dataclass(frozen=True)
class DriverProcess:
    pid: int
    create_time: float

    @classmethod
    def find(cls) -> "DriverProcess":
        """The nearest process from this one up that is not one of Spark's Python workers."""
        process = psutil.Process()
        while _is_spark_worker(process):
            try:
                parent = process.parent()
            except psutil.Error:  # gone meanwhile: the driver is going away; this process stands for it
                break
            if parent is None:
                break
            process = parent
        return cls(process.pid, process.create_time())

    @property
    def is_this_process(self) -> bool:
        return self.pid == os.getpid()

    def alive(self) -> bool:
        try:
            return psutil.Process(self.pid).create_time() == self.create_time
        except psutil.Error:
            return False

    def new_driver_id(self) -> str:
        return f"spark-driver-{socket.gethostname()}-{self.pid}-{uuid.uuid4().hex[:12]}"


def _is_spark_worker(process: psutil.Process) -> bool:
    try:
        cmdline = process.cmdline()
    except psutil.Error:
        return False
    module = cmdline.index("-m") + 1 if "-m" in cmdline else len(cmdline)
    return module < len(cmdline) and cmdline[module].startswith(_WORKER_MODULE)


@contextlib.contextmanager
def registered_driver(store: MetadataStore, uri: str) -> Iterator[str]:
    """The id of this driver's live registration on the metadata root of uri (store: a session there), held
    while the body creates the registry that names it (the registration cannot end meanwhile)."""
    driver = DriverProcess.find()
    if driver.is_this_process:
        with _InProcess.for_uri(store, uri) as driver_id:
            yield driver_id
    else:
        with keeper_registration(store, driver, uri) as driver_id:
            yield driver_id


# -- this process is the driver ----------------------------------------------------------------------


class _InProcess:
    """This process's own registration on one metadata root, with a thread that ends it once idle."""

    _lock = threading.Lock()
    _held: dict[str, "_InProcess"] = {}
    _retired: set["_InProcess"] = set()    # no longer handed out; each ends once no registry names it

    def __init__(self, uri: str):
        self.store = MetadataStore(uri)
        self.driver_id = DriverProcess.find().new_driver_id()
        try:
            self.registration = registry.register_writer(self.store, self.driver_id)
        except BaseException:
            self.store.close()
            raise
        self.uri = uri
        self.ended = False
        threading.Thread(target=self._end_when_idle, name=f"driver-{self.driver_id}", daemon=True).start()

    @classmethod
    @contextlib.contextmanager
    def for_uri(cls, store: MetadataStore, uri: str) -> Iterator[str]:
        """store: a session of the caller's, to see that the registration is in place (it is re-created
        after a session of its own expired, which may not have happened yet: then start a new one). The one not
        seen is retired, not ended: jobs running under it still name it, and a janitor would take their ledgers
        for abandoned; its thread ends it once no registry names it."""
        with cls._lock:
            held = cls._held.get(uri)
            if held is not None and not registry.writer_alive(store, held.driver_id):
                del cls._held[uri]
                cls._retired.add(held)
                held = None
            if held is None:
                held = cls._held[uri] = cls(uri)
            yield held.driver_id

    def end(self) -> None:
        """Under the class lock: the registration goes, and with it this driver's claim to its registries."""
        self.ended = True
        if self._held.get(self.uri) is self:
            del self._held[self.uri]
        self._retired.discard(self)
        _end(self.registration, self.store)

    def _end_when_idle(self) -> None:
        idle_since = time.monotonic()
        while not self.ended:
            time.sleep(_idle_check(IDLE_SECONDS))
            if not _idle(self.store, self.driver_id):
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= IDLE_SECONDS:
                with self._lock:
                    if self.ended:
                        return
                    if _idle(self.store, self.driver_id):
                        self.end()
                        return
                idle_since = time.monotonic()


def end_registrations() -> None:
    """End the registrations this process holds for itself (each would end once idle): for a program that
    drives writers directly and stops its ZooKeeper before it exits (the benchmarks)."""
    with _InProcess._lock:
        for held in [*_InProcess._held.values(), *_InProcess._retired]:
            held.end()


def _idle_check(idle_seconds: float) -> float:
    """Seconds between looks at whether a registry still names the driver."""
    return min(idle_seconds / 4, 10.0)


def _idle(store: MetadataStore, driver_id: str) -> bool:
    try:
        return not driver_in_use(store, driver_id)
    except LedgerError:
        return False  # ZooKeeper away: not known to be idle


def _end(registration, store: MetadataStore) -> None:
    """End the session, and with it the registration (ZooKeeper deletes a session's ephemerals when it
    closes). Deleting it first, when connected, makes that certain even if the close request is lost; when
    ZooKeeper is away, waiting for it would only keep this process alive."""
    if store.connected:
        with contextlib.suppress(LedgerError):
            registration.close()
    store.close()


# -- a keeper process for a driver JVM -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class KeeperFiles:
    """Where a driver's keeper for one metadata root says who it is (state), and the lock that job starts
    and the keeper's idle end take."""

    base: pathlib.Path

    @classmethod
    def of(cls, driver: DriverProcess, uri: str) -> "KeeperFiles":
        directory = private_keeper_directory()
        root = hashlib.sha256(redact_uri(uri).encode()).hexdigest()[:16]
        return cls(directory / f"{driver.pid}-{int(driver.create_time * 1000)}-{root}")

    @property
    def state(self) -> pathlib.Path:
        return self.base.with_suffix(".json")

    @property
    def log(self) -> pathlib.Path:
        return self.base.with_suffix(".log")

    @contextlib.contextmanager
    def locked(self, blocking: bool = True) -> Iterator[bool]:
        """The lock file, held; a holder may remove it (remove_keeper): one who then got the lock on the removed
        file takes the one at the path instead, so all holders hold the same file."""
        path = self.base.with_suffix(".lock")
        while True:
            with open(path, "a", opener=_private_file) as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
                except BlockingIOError:
                    yield False
                    return
                try:
                    if _inode(lock.fileno()) == _inode(path):
                        yield True
                        return
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)

    def remove(self) -> None:
        for suffix in (".json", ".lock", ".log"):
            self.base.with_suffix(suffix).unlink(missing_ok=True)

    def remove_keeper(self, driver_id: str, log_inode: int | None) -> None:
        """Under the lock: remove what belongs to the keeper that registers driver_id: the state if it names it
        (or there is none), then the lock, and the log if it is that keeper's (log_inode: the inode it writes;
        another keeper may have been started since and write a log of its own)."""
        state = self.read_state()
        if state is None or state.get("driver") == driver_id:
            self.state.unlink(missing_ok=True)
            self.base.with_suffix(".lock").unlink(missing_ok=True)
        if log_inode is not None and _inode(self.log) == log_inode:
            self.log.unlink(missing_ok=True)

    def read_state(self) -> dict | None:
        try:
            with open(self.state, opener=_private_file) as state:
                return json.loads(state.read())
        except (OSError, ValueError):
            return None

    def write_state(self, driver_id: str, keeper_pid: int) -> None:
        temporary = self.state.with_suffix(".tmp")
        temporary.unlink(missing_ok=True)   # one a killed process left
        with open(temporary, "x", opener=_private_file) as state:
            state.write(json.dumps({"driver": driver_id, "keeper": keeper_pid}))
        os.replace(temporary, self.state)


def keeper_directory() -> pathlib.Path:
    return pathlib.Path(tempfile.gettempdir()) / f"ledger-spark-drivers-{os.getuid()}"


def private_keeper_directory() -> pathlib.Path:
    """keeper_directory(), made for this user alone, or refused unless it is that already: a directory (not a
    link to one) that this user owns and no one else may enter (module docstring)."""
    directory = keeper_directory()
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    found = os.lstat(directory)
    if not stat.S_ISDIR(found.st_mode):
        problem = "is not a directory (a symbolic link or a file)"
    elif found.st_uid != os.getuid():
        problem = f"belongs to user {found.st_uid}, not to this user ({os.getuid()})"
    elif found.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        problem = f"is open to other users (mode {stat.filemode(found.st_mode)})"
    else:
        return directory
    raise DriverRegistrationError(
        f"the Spark drivers' keeper directory {directory} {problem}: another user may have made it to read or "
        f"replace this driver's files, so it is not used; remove it (its owner or root can), or set TMPDIR to a "
        f"directory of your own for the driver, and start the write again"
    )


def _private_file(path: str, flags: int) -> int:
    """open()'s opener for the keeper files: never through a symbolic link, and this user's alone."""
    return os.open(path, flags | os.O_NOFOLLOW, 0o600)


def _inode(file: int | pathlib.Path) -> int | None:
    """The inode of an open file descriptor or of a path (None: no such file)."""
    try:
        return (os.fstat(file) if isinstance(file, int) else file.stat()).st_ino
    except OSError:
        return None


def sweep_gone_drivers(directory: pathlib.Path, limit: int = SWEEP_DRIVERS) -> None:
    """Remove the keeper files of drivers whose process is gone (no process with that pid, or one started at
    another time: the pid was reused), looking at `limit` drivers at most, chosen at random so that the live ones
    do not hide the rest. Their keepers remove them as they end, but a keeper that was killed or crashed could
    not."""
    by_driver: dict[tuple[int, int], list[pathlib.Path]] = {}
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            if match := _KEEPER_FILE.fullmatch(entry.name):
                by_driver.setdefault((int(match[1]), int(match[2])), []).append(pathlib.Path(entry.path))
    for pid, started_ms in random.sample(sorted(by_driver), min(limit, len(by_driver))):
        if _driver_gone(pid, started_ms):
            for path in by_driver[pid, started_ms]:
                path.unlink(missing_ok=True)


def _driver_gone(pid: int, started_ms: int) -> bool:
    try:
        return abs(psutil.Process(pid).create_time() * 1000 - started_ms) >= 1000
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:   # not ours to look at: not known to be gone
        return False


@dataclasses.dataclass(frozen=True)
class _Keeper:
    """A keeper process this process started: the driver id it registers and the inode of the log it writes."""

    process: subprocess.Popen
    driver_id: str
    log_inode: int | None


_started: list[subprocess.Popen] = []  # keepers this process started, reaped when they end
# Keepers started ahead (keeper_started_ahead) and not yet taken over by a job start, by KeeperFiles.base.
_ahead: dict[pathlib.Path, _Keeper] = {}


@contextlib.contextmanager
def driver_registration_ahead(uri: str) -> Iterator[None]:
    """Around a job start's checks: this driver's keeper on uri's metadata root starts meanwhile, if it needs one
    (keeper_started_ahead). Nothing when this process is the driver."""
    driver = DriverProcess.find()
    if driver.is_this_process:
        yield
        return
    with keeper_started_ahead(driver, uri):
        yield


@contextlib.contextmanager
def keeper_started_ahead(driver: DriverProcess, uri: str) -> Iterator[None]:
    """Start driver's keeper for uri now unless one runs (its state file names a live keeper process), so that
    its start overlaps the body; the body's keeper_registration takes it over (and still checks, under the lock,
    that the running keeper is registered). One the body did not take over is stopped."""
    files = KeeperFiles.of(driver, uri)
    with files.locked():
        state = files.read_state()
        pending = _ahead.get(files.base)
        running = (pending is not None and pending.process.poll() is None) or (
            state is not None and _keeper_running(state["keeper"]))
        started = None if running else _spawn_keeper(driver, uri, files)
        if started is not None:
            _ahead[files.base] = started
    try:
        yield
    finally:
        if started is not None:
            with files.locked():
                if _ahead.get(files.base) is started:
                    del _ahead[files.base]
                    started.process.terminate()   # no job names it: its registration goes with it
                    files.remove_keeper(started.driver_id, started.log_inode)   # it may die before it can


@contextlib.contextmanager
def keeper_registration(store: MetadataStore, driver: DriverProcess, uri: str) -> Iterator[str]:
    """The registration a keeper process holds for the driver process on uri's metadata root (store: a
    session there): the running keeper's, or a new keeper's. Held while the body creates its registry."""
    files = KeeperFiles.of(driver, uri)
    with files.locked():
        _started[:] = [keeper for keeper in _started if keeper.poll() is None]
        state = files.read_state()
        if state is None or not registry.writer_alive(store, state["driver"]):
            ahead = _ahead.pop(files.base, None)   # started ahead by this job start, unless it ended idle since
            state = ahead and _registered(store, files, ahead)
            state = state or _registered(store, files, _spawn_keeper(driver, uri, files), must=True)
        yield state["driver"]


def _keeper_running(pid: int) -> bool:
    """Whether pid is a keeper process that has not exited (not a zombie, nor another process with its pid)."""
    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and KEEPER_MODULE in process.cmdline()
    except psutil.Error:
        return False


def _spawn_keeper(driver: DriverProcess, uri: str, files: KeeperFiles) -> _Keeper:
    """Under the lock: start a keeper, writing a log of its own (a keeper still running keeps writing the one it
    had, now unlinked); and remove the files of gone drivers meanwhile."""
    driver_id = driver.new_driver_id()
    command = [sys.executable, "-m", KEEPER_MODULE, "--driver-id", driver_id, "--pid", str(driver.pid),
               "--create-time", repr(driver.create_time), "--files", str(files.base),
               "--idle-seconds", repr(IDLE_SECONDS)]
    files.log.unlink(missing_ok=True)
    with open(files.log, "x", opener=_private_file) as log_file:
        keeper = subprocess.Popen(command, env={**os.environ, METADATA_ENV: uri}, stdin=subprocess.DEVNULL,
                                  stdout=log_file, stderr=log_file, start_new_session=True)
        log_inode = _inode(log_file.fileno())
    _started.append(keeper)
    sweep_gone_drivers(files.base.parent)
    return _Keeper(keeper, driver_id, log_inode)


def _registered(store: MetadataStore, files: KeeperFiles, started: _Keeper, must: bool = False) -> dict | None:
    """Once the keeper's registration is there, the state that names it (written to the state file). None if the
    keeper exited first (one started ahead may have ended idle), unless it must register: then that raises."""
    keeper, driver_id = started.process, started.driver_id
    deadline = time.monotonic() + KEEPER_START_SECONDS
    woken = threading.Event()

    def watch(event) -> None:
        woken.set()

    while not registry.writer_alive(store, driver_id, watch):
        exited = keeper.poll() is not None
        if exited and not must:
            return None
        if exited or time.monotonic() > deadline:
            keeper.kill()
            raise DriverRegistrationError(
                f"the Spark driver's liveness could not be registered in ZooKeeper (its keeper process "
                f"{'exited' if exited else 'did not register'} within {KEEPER_START_SECONDS:.0f}s; "
                f"log: {files.log}); check that ZooKeeper is reachable from the driver and start the write again"
            )
        woken.wait(0.05)   # the watch wakes it when the registration appears; the keeper is checked meanwhile
        woken.clear()
    files.write_state(driver_id, keeper.pid)
    return {"driver": driver_id, "keeper": keeper.pid}


def keep(driver_id: str, driver: DriverProcess, files: KeeperFiles, idle_seconds: float = IDLE_SECONDS) -> int:
    """The keeper: hold driver_id's registration while the driver process lives and a registry names it."""
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: stopping.set())
    store = MetadataStore(os.environ[METADATA_ENV])
    registration = registry.register_writer(store, driver_id)
    log.info("holding %s for driver process %d", driver_id, driver.pid)
    idle_since = checked = time.monotonic()
    try:
        while not stopping.wait(WATCH_INTERVAL):
            if not driver.alive():
                log.info("driver process %d is gone", driver.pid)
                files.remove()  # nothing of that driver starts a job any more
                return 0
            if time.monotonic() - checked < _idle_check(idle_seconds):
                continue
            checked = time.monotonic()
            if not _idle(store, driver_id):
                idle_since = checked
            elif checked - idle_since >= idle_seconds and _end_idle(store, driver_id, files, registration):
                log.info("no registry names %s any more", driver_id)
                return 0
        log.info("stopped by a signal")
        _end_stopped(driver_id, files, registration)
        return 0
    finally:
        _end(registration, store)


def _end_stopped(driver_id: str, files: KeeperFiles, registration) -> None:
    """A keeper stopped by a signal: as _end_idle, under the lock, its registration goes and then its files. A
    lock held for longer than STOP_LOCK_SECONDS (a job start waiting for another keeper) leaves them: a
    later start removes them once the driver is gone."""
    deadline = time.monotonic() + STOP_LOCK_SECONDS
    while True:
        with files.locked(blocking=False) as locked:
            if locked:
                with contextlib.suppress(LedgerError):
                    registration.close()
                files.remove_keeper(driver_id, _inode(2))   # fd 2: the log it writes
                return
        if time.monotonic() >= deadline:
            log.warning("lock %s busy for %.0fs: files left for a later start to remove", files.base,
                        STOP_LOCK_SECONDS)
            return
        time.sleep(WATCH_INTERVAL / 10)


def _end_idle(store: MetadataStore, driver_id: str, files: KeeperFiles, registration) -> bool:
    """Whether the keeper may end now: under the lock job starts hold, nothing names it and the state file
    no longer points to it (a job start after this spawns a new keeper). Its registration goes under the
    lock, so a job start never finds it there and names it as it goes (one started ahead, which no state
    file names yet, takes the job start to a new keeper)."""
    with files.locked(blocking=False) as locked:
        if not locked or not _idle(store, driver_id):
            return False
        with contextlib.suppress(LedgerError):
            registration.close()
        # a job start waiting for the lock finds no keeper and starts one
        files.remove_keeper(driver_id, _inode(2))   # fd 2: the log it writes
        return True
