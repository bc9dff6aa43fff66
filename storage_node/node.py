"""One storage node's life: lock the data directory, bind, cookie check, replay, serve (gRPC and metrics),
register, watch the operator's read-only flag, checkpoint, watch the disk, collect garbage, shut down."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import threading
from typing import Callable

from metadata import registry, serde
from metadata.model import NodeRegistration, NodeState
from metadata.store import MetadataStore
from protos.ready_file import NodeReady, remove_ready, write_ready
from storage_node.config import NodeConfig
from storage_node.cookie import check_cookie, record_snapshot, snapshot_recorded
from storage_node.data_dir_lock import DataDirLock
from storage_node.disk_usage import DataDirUsage
from storage_node.errors import JournalWriteError, StorageNodeError
from storage_node.gc import run_periodically
from storage_node.key_check import KeyCheck
from storage_node.metrics import NodeMetrics
from storage_node.server import create_server
from storage_node.service import StorageNodeService
from storage_node.storage import Storage

SHUTDOWN_GRACE_SECONDS = 3.0
ZOOKEEPER_SHUTDOWN_SECONDS = 5.0

log = logging.getLogger(__name__)


DISK_PUBLISH_STEP = 0.01      # republish the disk use when it moved by 1% of capacity (not on every check)
ENOSPC_FREED = 0.01           # an ENOSPC lifts once this fraction of the filesystem was freed since (DiskWatch)


@dataclasses.dataclass(frozen=True)
class DiskUse:
    used_bytes: int          # what the data directory takes (as du counts it)
    capacity_bytes: int      # what the node judges its fill by: --disk-quota-bytes, else the filesystem's size
    fill: float              # the filesystem's fill, or the data directory's of the quota if that is higher
    free_bytes: int          # the filesystem's free space
    filesystem_bytes: int    # the filesystem's size


def measure_disk(config: NodeConfig, files: DataDirUsage) -> DiskUse:
    """The disk as the node judges it (rule 9). Blocking: it stats the files that may have changed, a number that
    does not grow with what the node holds (storage_node/disk_usage.py)."""
    usage = shutil.disk_usage(config.data_dir)
    used = files.measure().allocated_bytes
    fill = (usage.total - usage.free) / usage.total
    capacity = usage.total
    if config.disk_quota_bytes:
        fill = max(fill, used / config.disk_quota_bytes)
        capacity = config.disk_quota_bytes
    return DiskUse(used, capacity, fill, usage.free, usage.total)


class DiskWatch:
    """Rule 9: read-only while the disk is over the threshold (--read-only, ENOSPC and the operator's flag
    are separate reasons, so the disk coming back under the threshold does not lift them by itself).

    A journal write that failed with ENOSPC (the disk filled between two checks) is lifted once the disk is
    under the threshold and the filesystem's free space grew by ENOSPC_FREED of its size since the
    failure: space was freed, not merely a smaller group left room. A write that still does not fit fails
    again, harmlessly (the group is undone and its adds answered ERROR), and turns the node read-only again."""

    def __init__(self, config: NodeConfig, storage: Storage):
        self.config = config
        self.storage = storage

    async def check(self) -> DiskUse:
        use = await asyncio.to_thread(measure_disk, self.config, self.storage.files)
        self.apply(use)
        return use

    def apply(self, use: DiskUse) -> None:
        storage = self.storage
        full = use.fill >= self.config.read_only_threshold
        if full and not storage.is_read_only_because("disk"):
            storage.set_read_only(
                "disk", f"disk of {self.config.data_dir} is {use.fill:.1%} full{self._of_quota()}, over "
                        f"--read-only-threshold {self.config.read_only_threshold}"
            )
        elif not full and storage.is_read_only_because("disk"):
            storage.set_read_only("disk", "")
        failed_with = storage.enospc_free_bytes
        if (not full and storage.is_read_only_because("enospc") and failed_with is not None
                and use.free_bytes >= failed_with + ENOSPC_FREED * use.filesystem_bytes):
            storage.set_read_only("enospc", "")
            storage.enospc_free_bytes = None

    def _of_quota(self) -> str:
        quota = self.config.disk_quota_bytes
        return f" (or of its --disk-quota-bytes {quota})" if quota else ""


OPERATOR_READ_ONLY = "set read-only by an operator (`ledger node readonly`); `--off` makes it writable"


async def serve(config: NodeConfig) -> int:
    """The node's life. The order is what keeps an operator's mistake harmless (issue 15 item 7): the data
    directory is locked first (one process per directory, storage_node/data_dir_lock.py); both ports are bound
    before anything is written to ZooKeeper or the directory, so a node that cannot listen leaves no cookie
    behind; the node registers only once it serves."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    lock = await asyncio.to_thread(DataDirLock.acquire, config.data_dir, config.node_id)
    try:
        await _serve_locked(config, lock, stop)
    finally:
        lock.release()
    return 0


async def _serve_locked(config: NodeConfig, lock: DataDirLock, stop: asyncio.Event) -> None:
    metrics = NodeMetrics()
    storage = Storage(config, metrics)
    metrics.watch(
        data_dir=config.data_dir, read_only=lambda: bool(storage.read_only_reason or storage.broken),
        data_bytes=storage.data_bytes,
        queue_depth=lambda: storage.journal.queued_records if storage.journal else 0,
    )
    service = StorageNodeService(storage, config)
    await service.set_serving(False)
    server, port = create_server(config, service)
    try:
        metrics_server = metrics.serve(config.host, config.metrics_port)
    except BaseException:
        await server.stop(None)
        raise
    service.address = f"{config.host}:{port}"
    await asyncio.to_thread(lock.record, address=service.address)
    try:
        session = await asyncio.to_thread(_Session.open, config)
        try:
            await asyncio.to_thread(check_cookie, session.store, config.data_dir, config.node_id, log.warning)
            _check_keys(config, storage, session.store)
            await server.start()
            try:
                await storage.open()
                await _keep_a_snapshot(storage)
                await _serve_registered(config, session, storage, service, stop,
                                        f"{config.host}:{metrics_server.server_address[1]}")
            finally:
                await service.set_serving(False)
                await server.stop(SHUTDOWN_GRACE_SECONDS)
                await storage.close()
        finally:
            await session.close()
    finally:
        await server.stop(None)     # a no-op once stopped; releases the port of a node that never started it
        await asyncio.to_thread(metrics_server.shutdown)
        metrics_server.server_close()


class _Session:
    """The node's ZooKeeper session. Closing it is also how the node deregisters: ZooKeeper then removes
    exactly the ephemeral znodes this session owns, so an exiting node can never delete a registration that
    another process put in its path (a second process on its directory, issue 15 item 7) the way deleting
    the path did."""

    def __init__(self, store: MetadataStore):
        self.store = store
        self._closed = False

    @classmethod
    def open(cls, config: NodeConfig) -> "_Session":
        return cls(MetadataStore(config.metadata, session_timeout=config.zk_session_timeout))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.store.connected:
            log.warning("deregistering did not finish: ZooKeeper is unreachable, so the registration "
                        "goes when the session expires; stopping anyway")
        await _without_waiting_for_zookeeper(self.store.close, "deregistering and closing the ZooKeeper session")


def _check_keys(config: NodeConfig, storage: Storage, store: MetadataStore) -> None:
    """Rule 7 at first sight (storage_node/key_check.py), unless --bind-keys-unchecked, which the log says."""
    if config.bind_keys_unchecked:
        log.warning("--bind-keys-unchecked: master keys are bound on a ledger's first add, fence or WriteLac without "
                    "a look at its metadata; any client holding the token can claim ledger ids not created yet")
    else:
        storage.key_check = KeyCheck(store, config.node_id, storage.metrics.key_check_lookups)


async def _keep_a_snapshot(storage: Storage) -> None:
    """Rule 8 for the snapshot file: from the node's first start on there is one and the cookie records it,
    so a snapshot lost later is noticed at start (storage_node/cookie.py). Recorded only once it is in place:
    a crash in between leaves a snapshot the next start records."""
    if not await asyncio.to_thread(snapshot_recorded, storage.data_dir):
        await storage.checkpoint()
        await asyncio.to_thread(record_snapshot, storage.data_dir)


async def _serve_registered(config: NodeConfig, session: _Session, storage: Storage,
                            service: StorageNodeService, stop: asyncio.Event, metrics_address: str) -> None:
    """Serve, then register (a client that finds the registration finds a node that answers), until stop."""
    loop = asyncio.get_running_loop()
    store = session.store
    changed = asyncio.Event()

    def operator_flag(on: bool) -> None:
        storage.set_read_only("operator", OPERATOR_READ_ONLY if on else "")
        changed.set()

    # The first call happens inside watch_readonly, in its worker thread; call_soon_threadsafe queues it
    # ahead of that thread's own result, so the flag is in place before the node registers.
    await asyncio.to_thread(registry.watch_readonly, store, config.node_id,
                            lambda on: loop.call_soon_threadsafe(operator_flag, on))
    storage.on_change = changed.set           # a journal write failed: read-only (ENOSPC) or broken now
    disk = DiskWatch(config, storage)
    reg = _registration(NodeRegistration(config.node_id, service.address, data_dir=str(config.data_dir),
                                         pid=os.getpid(), metrics_address=metrics_address),
                        storage, await disk.check())
    await service.set_serving(True)
    registration = _RegistrationWriter(await asyncio.to_thread(registry.register_node, store, reg))
    security = ("mutual TLS" if config.tls_ca else "TLS") if config.tls_cert else "plain text"
    if config.auth_token_file:
        security += ", token required"
    security += ", keys bound unchecked" if config.bind_keys_unchecked else ", keys checked against metadata"
    if config.ready_file is not None:
        await asyncio.to_thread(_write_ready_file, config, service.address, metrics_address)
    log.info("serving on %s (%s; metrics on http://%s/metrics)", service.address, security, metrics_address)
    collector = asyncio.ensure_future(
        run_periodically(store, storage, config.gc_interval, config.compaction_threshold, config.gc_grace,
                         config.node_id, config.gc_overreplicated_interval)
    )
    next_checkpoint = loop.time() + config.checkpoint_interval
    try:
        while not stop.is_set():
            changed.clear()
            await _first_of(stop.wait(), changed.wait(), timeout=config.disk_check_interval)
            use = await disk.check()
            _refresh_gauges(storage)
            if storage.broken:
                await service.set_serving(False)     # gRPC health too: it serves nothing until restarted
            current = _registration(reg, storage, use)
            if _worth_publishing(reg, current):
                reg = current
                registration.publish(reg)
            if loop.time() >= next_checkpoint and not storage.broken:
                try:
                    await storage.checkpoint(only_if_changed=True)    # none while nothing changed (an idle node)
                except JournalWriteError:
                    pass                                     # broke meanwhile: the next round publishes it
                except OSError as exc:   # a full disk, say: the journal still holds everything since the last one
                    log.warning("checkpoint not written (%s); trying again in %g s", exc, config.checkpoint_interval)
                next_checkpoint = loop.time() + config.checkpoint_interval
    finally:
        if config.ready_file is not None:
            await asyncio.to_thread(remove_ready, config.ready_file)     # it no longer serves
        registration.close()
        collector.cancel()
        await asyncio.gather(collector, return_exceptions=True)
        # Deregister before the server stops taking calls: by closing the session, never by deleting the path.
        await session.close()


def _write_ready_file(config: NodeConfig, address: str, metrics_address: str) -> None:
    """--ready-file: the launcher's sign that the node serves (protos/ready_file.py)."""
    try:
        write_ready(config.ready_file, NodeReady(config.node_id, address, metrics_address, os.getpid()))
    except OSError as exc:   # whoever waits for it would wait in vain: stop (deregistering) and say why
        raise StorageNodeError(f"cannot write --ready-file {config.ready_file}: {exc}") from exc


async def _without_waiting_for_zookeeper(call: Callable[[], None], what: str) -> None:
    """Shutdown deregisters and closes the session, but waits for ZooKeeper at most ZOOKEEPER_SHUTDOWN_SECONDS:
    while it is unreachable a kazoo call blocks until it is back, and a node must stop on SIGTERM whatever
    ZooKeeper does (its ephemeral registration ends with its session anyway). The call runs on a daemon
    thread, not on the loop's executor, whose threads asyncio.run would wait for before the process exits."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def run() -> None:
        error = None
        try:
            call()
        except Exception as exc:  # best effort: what it did not remove goes with the session
            error = f"failed: {exc}"
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(error))

    threading.Thread(target=run, name=what, daemon=True).start()
    try:
        error = await asyncio.wait_for(asyncio.shield(done), ZOOKEEPER_SHUTDOWN_SECONDS)
    except asyncio.TimeoutError:
        error = f"did not finish within {ZOOKEEPER_SHUTDOWN_SECONDS:.0f}s (ZooKeeper unreachable?)"
    if error is not None:
        log.warning("%s %s; stopping anyway", what, error)


async def _first_of(*waits, timeout: float) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


def _refresh_gauges(storage: Storage) -> None:
    """The gauges of what the node holds, on the loop thread that owns the ledgers (counts Storage keeps)."""
    metrics = storage.metrics
    metrics.ledgers.set(len(storage.ledgers))
    metrics.entries.set(storage.entry_count())
    metrics.fenced_ledgers.set(storage.fenced_count())


def _registration(reg: NodeRegistration, storage: Storage, use: DiskUse) -> NodeRegistration:
    """reg with the node's state, read-only reason, health and disk use now. A broken node registers
    READ_ONLY (no ensemble may pick it; a state every client can decode) with health "broken: ..."."""
    writable = not (storage.read_only_reason or storage.broken)
    return dataclasses.replace(
        reg, state=NodeState.AVAILABLE if writable else NodeState.READ_ONLY,
        read_only_reason=storage.read_only_reason, health=storage.health, disk_used_bytes=use.used_bytes,
        disk_capacity_bytes=use.capacity_bytes, disk_fill=round(use.fill, 4),
    )


def _worth_publishing(published: NodeRegistration, current: NodeRegistration) -> bool:
    """Whether to write the registration again: a change of state, reason or health, or of the disk use by a
    step (DISK_PUBLISH_STEP of capacity), so that ZooKeeper is not written on every disk check."""
    if (published.state, published.read_only_reason, published.health) != (current.state,
                                                                         current.read_only_reason, current.health):
        return True
    moved = abs(current.disk_used_bytes - published.disk_used_bytes)
    return (abs(current.disk_fill - published.disk_fill) >= DISK_PUBLISH_STEP
            or moved >= DISK_PUBLISH_STEP * max(current.disk_capacity_bytes, 1))


class _RegistrationWriter:
    """Writes the node's registration on a daemon thread, only ever its latest version and one write at a
    time (so they land in order). While ZooKeeper is away a write waits for it; the node's loop (disk checks,
    read-only switches, checkpoints) must not, nor must an exiting node."""

    def __init__(self, registration: registry.EphemeralRegistration):
        self._registration = registration
        self._latest: NodeRegistration | None = None
        self._closed = False
        self._wake = threading.Condition()
        threading.Thread(target=self._run, name="registration writer", daemon=True).start()

    def publish(self, reg: NodeRegistration) -> None:
        with self._wake:
            self._latest = reg
            self._wake.notify()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._latest is None and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                reg, self._latest = self._latest, None
            try:
                self._registration.update(serde.encode_node(reg))
            except Exception as exc:  # ZooKeeper away: the latest data is written when it is back (registry.py)
                if not self._closed:
                    log.warning("could not publish state %s (%s) yet: %s", reg.state.value, reg.health, exc)
