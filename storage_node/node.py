"""One storage node's life: cookie check, replay, serve, register, checkpoint, watch the disk, shut down."""
from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import signal
import sys

from metadata import registry, serde
from metadata.model import NodeRegistration, NodeState
from metadata.store import MetadataStore
from storage_node.config import NodeConfig
from storage_node.cookie import check_cookie
from storage_node.server import create_server
from storage_node.service import StorageNodeService
from storage_node.storage import Storage

SHUTDOWN_GRACE_SECONDS = 3.0


def disk_fill(config: NodeConfig) -> float:
    usage = shutil.disk_usage(config.data_dir)
    return (usage.total - usage.free) / usage.total


class DiskWatch:
    """Rule 9: read-only while the disk is over the threshold (sticky for --read-only and ENOSPC)."""

    def __init__(self, config: NodeConfig, storage: Storage):
        self.config = config
        self.storage = storage
        self._full = False

    def check(self) -> None:
        fill = disk_fill(self.config)
        full = fill >= self.config.read_only_threshold
        if full and not self.storage.read_only_reason:
            self.storage.set_read_only(
                f"disk of {self.config.data_dir} is {fill:.1%} full, over --read-only-threshold "
                f"{self.config.read_only_threshold}"
            )
            self._full = True
        elif not full and self._full:
            self.storage.set_read_only("")
            self._full = False


async def serve(config: NodeConfig) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    store = await asyncio.to_thread(MetadataStore, config.metadata, session_timeout=config.zk_session_timeout)
    try:
        await asyncio.to_thread(check_cookie, store, config.data_dir, config.node_id)
        storage = Storage(config)
        service = StorageNodeService(storage, config)
        await service.set_serving(False)
        server, port = create_server(config, service)
        await server.start()
        try:
            service.address = f"{config.host}:{port}"
            await storage.open()
            await _serve_registered(config, store, storage, service, stop)
        finally:
            await service.set_serving(False)
            await server.stop(SHUTDOWN_GRACE_SECONDS)
            await storage.close()
    finally:
        await asyncio.to_thread(store.close)
    return 0


async def _serve_registered(config: NodeConfig, store: MetadataStore, storage: Storage,
                            service: StorageNodeService, stop: asyncio.Event) -> None:
    disk = DiskWatch(config, storage)
    disk.check()
    published = storage.read_only_reason
    reg = NodeRegistration(config.node_id, service.address, _state(published), str(config.data_dir), os.getpid())
    registration = await asyncio.to_thread(registry.register_node, store, reg)
    await service.set_serving(True)
    print(f"storage node {config.node_id} serving on {service.address}", flush=True)
    next_checkpoint = asyncio.get_running_loop().time() + config.checkpoint_interval
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), config.disk_check_interval)
            except asyncio.TimeoutError:
                pass
            disk.check()
            if storage.read_only_reason != published:
                published = storage.read_only_reason
                reg = dataclasses.replace(reg, state=_state(published))
                await _publish(registration, reg)
            if asyncio.get_running_loop().time() >= next_checkpoint:
                await storage.checkpoint()
                next_checkpoint = asyncio.get_running_loop().time() + config.checkpoint_interval
    finally:
        await asyncio.to_thread(registration.close)


def _state(read_only_reason: str) -> NodeState:
    return NodeState.READ_ONLY if read_only_reason else NodeState.AVAILABLE


async def _publish(registration: registry.EphemeralRegistration, reg: NodeRegistration) -> None:
    try:
        await asyncio.to_thread(registration.update, serde.encode_node(reg))
    except Exception as exc:  # ZooKeeper away: the registration is re-created with this state on reconnect
        print(f"storage node {reg.node_id}: could not publish state {reg.state.value}: {exc}",
              file=sys.stderr, flush=True)
