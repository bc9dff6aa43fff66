"""Issue 12 finding 6: an executor reads an OPEN ledger up to the LAC its driver planned with, even when the
nodes it asks know a lower LAC (each node's LAC lags its own way; entries up to any LAC seen were
acknowledged)."""
import pyarrow as pa
import pytest

from connector.client import LedgerClient, LedgerError
from connector.spark.options import LedgerOptions
from connector.spark.planning import LedgerPartition
from connector.spark.read import read_partitions
from connector.spark.schema import raw_read_schema
from metadata.model import Fragment, LedgerMetadata
from protos.digest import password_hash
from tests.harness.node_client import KEY, NodeClient, make_entry, payload_for

PASSWORD = b"test-password"
ENTRIES = 10


def open_ledger_with_lagging_lacs(store, nodes) -> int:
    """An OPEN ledger whose ten entries every node holds, each piggybacking LAC -1: as a pipelined writer
    sends them before any completes. The writer saw all ten acknowledged; no node knows it."""
    ensemble = tuple(n.node_id for n in nodes)
    ledger_id = store.create_ledger(LedgerMetadata(0, 3, 3, 2, (Fragment(0, ensemble),),
                                                   password_hash=password_hash(PASSWORD))).value.ledger_id
    entries = [make_entry(ledger_id, e, payload_for(ledger_id, e), key=KEY, lac=-1) for e in range(ENTRIES)]
    for node in nodes:
        with NodeClient(node.address) as nc:
            assert all(r.status == 1 for r in nc.add(*entries))
    return ledger_id


def test_a_read_up_to_a_confirmed_entry_ignores_a_lower_lac_from_the_nodes(cluster, store, metadata_uri):
    ledger_id = open_ledger_with_lagging_lacs(store, cluster(3))
    with LedgerClient(metadata_uri, timeout=3.0) as client:
        handle = client.open_ledger(ledger_id, password=PASSWORD, recover=False)
        assert handle.last_entry_id == -1  # what the nodes know
        read = [e.payload for e in handle.read(0, ENTRIES - 1, confirmed=ENTRIES - 1)]
    assert read == [payload_for(ledger_id, e) for e in range(ENTRIES)]


def test_an_executor_reads_the_partition_its_driver_planned_from_a_higher_lac(cluster, store, metadata_uri):
    ledger_id = open_ledger_with_lagging_lacs(store, cluster(3))
    options = LedgerOptions.parse({"metadata": metadata_uri, "ledgers": str(ledger_id),
                                   "password": PASSWORD.decode()})
    schema = raw_read_schema(include_metadata=False)
    partition = LedgerPartition(ledger_id, 0, ENTRIES - 1)
    batches = list(read_partitions(options, schema, True, partition, lambda _: None))
    payloads = pa.Table.from_batches(batches).column("payload").to_pylist()
    assert payloads == [payload_for(ledger_id, e) for e in range(ENTRIES)]


def test_a_reader_given_a_confirmed_entry_opens_without_asking_the_nodes(cluster, store, metadata_uri):
    """An executor's read task knows its entries were confirmed (its driver planned up to a LAC it read), so
    its open asks no node for a LAC: with every node paused it still opens, where an open that asks fails."""
    nodes = cluster(3)
    ledger_id = open_ledger_with_lagging_lacs(store, nodes)
    with LedgerClient(metadata_uri, timeout=2.0) as client:
        for node in nodes:
            node.pause()
        try:
            with pytest.raises(LedgerError):
                client.open_ledger(ledger_id, password=PASSWORD, recover=False)
            handle = client.open_ledger(ledger_id, password=PASSWORD, recover=False, confirmed=ENTRIES - 1)
            assert handle.last_entry_id == ENTRIES - 1
        finally:
            for node in nodes:
                node.resume()
        read = [e.payload for e in handle.read(0, ENTRIES - 1)]
    assert read == [payload_for(ledger_id, e) for e in range(ENTRIES)]
