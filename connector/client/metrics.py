"""Prometheus metrics of the ledger client library, on its own registry so an application decides where
they go. Every LedgerClient in the process counts into the same metrics.

Expose them from the application, for example::

    import prometheus_client
    from connector.client import metrics
    prometheus_client.start_http_server(9100, registry=metrics.REGISTRY)    # serves /metrics
    # or, inside an existing web app:
    body = prometheus_client.generate_latest(metrics.REGISTRY)
"""
from __future__ import annotations

import time
from typing import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry()

ADDS = Counter("ledger_client_adds", "Entries acknowledged by an ack quorum (recovery write-backs included)",
               registry=REGISTRY)
ADD_BYTES = Counter("ledger_client_add_bytes", "Payload bytes of acknowledged entries", registry=REGISTRY)
ADD_LATENCY = Histogram(
    "ledger_client_add_latency_seconds", "From sending an entry to its ack quorum",
    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0), registry=REGISTRY,
)
READS = Counter("ledger_client_entries_read", "Entries read back (digest verified)", registry=REGISTRY)
READ_BYTES = Counter("ledger_client_read_bytes", "Payload bytes read back", registry=REGISTRY)
RECOVERIES = Counter("ledger_client_recoveries", "Ledgers this client closed by recovery", registry=REGISTRY)
ENSEMBLE_CHANGES = Counter("ledger_client_ensemble_changes", "Ensemble changes stored by writers",
                           registry=REGISTRY)


def adds_completed(adds: Iterable) -> None:
    """PendingAdds that reached their ack quorum together (one call per batch of answers)."""
    now = time.monotonic()
    count = size = 0
    for add in adds:
        count += 1
        size += len(add.payload)
        ADD_LATENCY.observe(now - add.sent_at)
    if count:
        ADDS.inc(count)
        ADD_BYTES.inc(size)


def entries_read(entries: Iterable) -> None:
    count = size = 0
    for entry in entries:
        count += 1
        size += len(entry.payload)
    if count:
        READS.inc(count)
        READ_BYTES.inc(size)
