"""Prometheus metrics of one storage node, served over HTTP (`--metrics-port`).

Each node has its own registry. Adds are counted once per group commit (the journal's on_synced),
never per entry, so the hot add path stays as fast as it is; the add latency histogram gets one
observation per group: the wait of its oldest add, from its arrival to the group's fsync.
Gauges that need a walk over all ledgers are refreshed by the node's housekeeping loop (on the event
loop thread, which owns that state); the others are read when scraped.
"""
from __future__ import annotations

import shutil
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from storage_node.errors import StorageNodeError

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()

        def histogram(name: str, what: str) -> Histogram:
            return Histogram(name, what, buckets=_LATENCY_BUCKETS, registry=registry)

        self.add_latency = histogram("ledger_node_add_latency_seconds",
                                     "Per group commit: from the arrival of its first add to its fsync")
        self.read_latency = histogram("ledger_node_read_latency_seconds", "Per Read or ReadRange request")
        self.fsync_latency = histogram("ledger_node_journal_fsync_seconds", "Journal fsync time per group commit")
        self.entries_added = Counter("ledger_node_entries_added", "Entries made durable", registry=registry)
        self.bytes_added = Counter("ledger_node_bytes_added", "Payload bytes made durable", registry=registry)
        self.entries_read = Counter("ledger_node_entries_read", "Entries read back", registry=registry)
        self.bytes_read = Counter("ledger_node_bytes_read", "Payload bytes read back", registry=registry)
        self.gc_ledgers_deleted = Counter("ledger_node_gc_ledgers_deleted",
                                          "Ledgers dropped because they were deleted from metadata",
                                          registry=registry)
        self.gc_overreplicated_deleted = Counter("ledger_node_gc_overreplicated_ledgers_deleted",
                                                 "Ledgers dropped because their metadata names this node nowhere "
                                                 "any more (over-replicated copies)", registry=registry)
        self.gc_bytes_reclaimed = Counter("ledger_node_gc_bytes_reclaimed",
                                          "File bytes freed by compaction", registry=registry)
        self.gc_files_deleted = Counter("ledger_node_gc_files_deleted",
                                        "Journal segments and compacted files removed", registry=registry)
        self.key_check_lookups = Counter("ledger_node_key_check_lookups",
                                         "Metadata reads of the first-sight key check (one per ledger new to the "
                                         "node), by outcome: found, absent (no metadata: refused), failed "
                                         "(ZooKeeper did not answer: refused as unknown)", ["outcome"],
                                         registry=registry)
        self.ledgers = Gauge("ledger_node_ledgers", "Ledgers stored", registry=registry)
        self.entries = Gauge("ledger_node_entries", "Entries stored", registry=registry)
        self.fenced_ledgers = Gauge("ledger_node_fenced_ledgers", "Ledgers fenced on this node", registry=registry)
        self.journal_queue_depth = Gauge("ledger_node_journal_queue_depth",
                                         "Records appended and waiting for their fsync", registry=registry)
        self.read_only = Gauge("ledger_node_read_only", "1 while the node refuses normal adds", registry=registry)
        self.disk_used = Gauge("ledger_node_disk_used_bytes", "Used bytes of the data directory's file system",
                               registry=registry)
        self.disk_total = Gauge("ledger_node_disk_total_bytes", "Size of the data directory's file system",
                                registry=registry)
        self.data_bytes = Gauge("ledger_node_data_bytes", "Bytes of journal segments and compacted files",
                                registry=registry)

    def group_synced(self, entries: int, payload_bytes: int, fsync_seconds: float, add_seconds: float) -> None:
        self.fsync_latency.observe(fsync_seconds)
        if entries:
            self.entries_added.inc(entries)
            self.bytes_added.inc(payload_bytes)
            self.add_latency.observe(add_seconds)

    def read_done(self, entries: int, payload_bytes: int, seconds: float) -> None:
        self.read_latency.observe(seconds)
        if entries:
            self.entries_read.inc(entries)
            self.bytes_read.inc(payload_bytes)

    def watch(self, *, data_dir, queue_depth: Callable[[], int], read_only: Callable[[], bool],
              data_bytes: Callable[[], int]) -> None:
        """Gauges read at scrape time (cheap, and safe from the HTTP server's thread)."""
        self.journal_queue_depth.set_function(queue_depth)
        self.read_only.set_function(lambda: 1 if read_only() else 0)
        self.disk_used.set_function(lambda: _disk_usage(data_dir)[0])
        self.disk_total.set_function(lambda: _disk_usage(data_dir)[1])
        self.data_bytes.set_function(data_bytes)

    def serve(self, host: str, port: int):
        """Start the HTTP endpoint in a daemon thread; returns the server (its port may have been 0)."""
        try:
            server, _ = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise StorageNodeError(
                f"cannot serve metrics on {host}:{port} ({exc}): choose another --metrics-port (0 picks a free one)"
            ) from exc
        return server


def _disk_usage(data_dir) -> tuple[int, int]:
    usage = shutil.disk_usage(data_dir)
    return usage.total - usage.free, usage.total
