"""Metrics scraped over HTTP from a real node (found through its ZooKeeper registration) and from the
client library's registry, parsed with prometheus_client's own parser."""
from __future__ import annotations

import subprocess
import sys
import urllib.request

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from connector.client import LedgerClient
from connector.client import metrics as client_metrics
from metadata import registry
from tests.harness.node_client import PASSWORD, NodeClient, given_ledgers, make_entry, payload_for
from tests.harness.poll import poll_until


def samples(text: str) -> dict[str, float]:
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if not s.labels or set(s.labels) == {"le"} and s.labels["le"] == "+Inf"}


def scrape(address: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        return samples(response.read().decode())


def test_node_metrics_count_adds_reads_and_show_read_only(start_node, store, metadata_uri):
    given_ledgers(store, {1: PASSWORD})
    node = start_node("metered")
    address = registry.list_nodes(store)[node.node_id].metrics_address
    assert address.startswith("127.0.0.1:")
    first = scrape(address)
    assert first["ledger_node_read_only"] == 0 and first["ledger_node_disk_total_bytes"] > 0
    adds = 60
    with NodeClient(node.address) as client:
        results = client.add_batches([[make_entry(1, e, payload_for(1, e, 500))] for e in range(adds)])
        assert len(results) == adds
        for e in range(10):
            assert client.read(1, e).payload == payload_for(1, e, 500)
    after = scrape(address)
    assert after["ledger_node_entries_added_total"] >= adds
    assert after["ledger_node_bytes_added_total"] >= adds * 500
    assert after["ledger_node_add_latency_seconds_count"] >= 1
    assert after["ledger_node_journal_fsync_seconds_count"] >= 1
    assert after["ledger_node_read_latency_seconds_count"] >= 10
    assert after["ledger_node_entries_read_total"] >= 10
    poll_until(lambda: scrape(address)["ledger_node_entries"] == adds, timeout=10, what="the entries gauge")
    assert scrape(address)["ledger_node_ledgers"] == 1

    def readonly(*flags: str) -> None:
        subprocess.run([sys.executable, "-m", "connector.cli", "node", "readonly", node.node_id,
                        "--metadata", metadata_uri, *flags], check=True, capture_output=True, timeout=60)

    readonly()
    poll_until(lambda: scrape(address)["ledger_node_read_only"] == 1, timeout=10, what="the read-only gauge")
    readonly("--off")
    poll_until(lambda: scrape(address)["ledger_node_read_only"] == 0, timeout=10, what="the gauge back at 0")


def test_client_metrics_count_adds_reads_and_recoveries(cluster, metadata_uri):
    cluster(3)
    before = samples(generate_latest(client_metrics.REGISTRY).decode())
    with LedgerClient(metadata_uri) as client:
        writer = client.create_ledger(3, 3, 2)
        for i in range(20):
            writer.append(f"event {i}".encode())
        # Opened with recovery while its writer never closed it: this client closes it by recovery.
        entries = list(client.open_ledger(writer.ledger_id).read(0, 19))
        assert len(entries) == 20
    after = samples(generate_latest(client_metrics.REGISTRY).decode())

    def grew(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert grew("ledger_client_adds_total") >= 20
    assert grew("ledger_client_add_latency_seconds_count") >= 20
    assert grew("ledger_client_entries_read_total") >= 20
    assert grew("ledger_client_recoveries_total") == 1
