"""Spark's driver-side steps load only the metadata side of the client.

Spark starts a Python worker of its own for each kind of driver-side step (finding the schema, planning a read,
preparing and committing a write), and a query's first run waits for each in turn. These steps read and write
ZooKeeper: a LedgerClient opens its event loop and gRPC transport at its first call to a storage node
(api.LedgerClient._node_io), and the client package loads its modules on first use, so these steps never import
gRPC, asyncio, crc32c or prometheus_client (about 0.2 CPU s in each new worker). Here a fresh interpreter runs the
steps, as those workers do, against a real cluster.
"""
from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import threading

import pytest

from connector.client import ClientClosedError, LedgerClient, Streams

HEAVY = ("grpc", "asyncio", "crc32c", "prometheus_client", "connector.client.runner", "connector.client.transport")

STEPS = """
import sys
from pyspark.sql.types import LongType, StructField, StructType
from connector.spark import LedgerDataSource
from connector.spark.planning import pieces_of

uri = sys.argv[1]
read = LedgerDataSource({"metadata": uri, "path": "events"})
partitions = read.reader(read.schema()).partitions()
entries = sum(p.last_entry - p.first_entry + 1 for partition in partitions for p in pieces_of(partition))
write = LedgerDataSource({"metadata": uri, "path": "table"})
write.writer(StructType([StructField("x", LongType())]), False).commit([])
print(entries, ",".join(m for m in %r if m in sys.modules))
""" % (HEAVY,)


def test_planning_a_read_and_committing_a_write_load_no_node_io(metadata_uri, cluster):
    cluster(3)
    with LedgerClient(metadata_uri) as lc, Streams(lc).open_writer("events", max_ledger_entries=2) as sw:
        for n in range(5):
            sw.append(b"entry %d" % n)
    done = subprocess.run([sys.executable, "-c", STEPS, metadata_uri], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    entries, _, loaded = done.stdout.strip().splitlines()[-1].partition(" ")
    assert int(entries) == 5        # the steps did their work
    assert loaded == ""             # and none of them loaded the storage nodes' side


def test_the_first_call_to_a_node_starts_the_client_s_io(metadata_uri, cluster):
    """A client that has only read metadata so far (a shared driver-side client) reads entries all the same."""
    cluster(3)
    with LedgerClient(metadata_uri) as lc:
        with lc.create_ledger(3, 3, 2) as w:
            w.append(b"first")
    with LedgerClient(metadata_uri) as lc:
        assert lc._io is None
        assert lc.ledger_metadata(w.ledger_id).is_closed
        assert lc._io is None
        assert [e.payload for e in lc.open_ledger(w.ledger_id).read()] == [b"first"]
        assert lc._io is not None


def test_threads_that_reach_the_nodes_first_at_once_share_one_transport(metadata_uri, cluster):
    cluster(3)
    with LedgerClient(metadata_uri) as lc:
        with lc.create_ledger(3, 3, 2) as w:
            w.append(b"first")
    made = []
    another = threading.Event()

    class Counting(LedgerClient):
        def transport(self):
            made.append(threading.current_thread().name)
            if len(made) > 1:
                another.set()
            else:
                another.wait(1.0)   # holds the first maker so that a second one, if let in, arrives meanwhile
            return super().transport()

    with Counting(metadata_uri) as lc:
        start = threading.Barrier(8)

        def read(_) -> list[bytes]:
            start.wait(30)
            return [e.payload for e in lc.open_ledger(w.ledger_id).read()]

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            assert list(pool.map(read, range(8))) == [[b"first"]] * 8
    assert len(made) == 1


def test_a_client_closed_before_its_first_call_to_a_node_refuses_it(metadata_uri, cluster):
    """Nothing would close a transport made after the client's close: the call is refused, clearly."""
    cluster(3)
    with LedgerClient(metadata_uri) as lc:
        with lc.create_ledger(3, 3, 2) as w:
            w.append(b"first")
    lc = LedgerClient(metadata_uri)
    handle = lc.open_ledger(w.ledger_id)   # a closed ledger: metadata only
    lc.close()
    with pytest.raises(ClientClosedError, match="closed; open a new one"):
        list(handle.read())
    assert lc._io is None
