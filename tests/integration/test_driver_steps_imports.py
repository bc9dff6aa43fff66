"""Spark's driver-side steps load only the metadata side of the client.

Spark starts a Python worker of its own for each kind of driver-side step (finding the schema, planning a read,
preparing and committing a write), and a query's first run waits for each in turn. These steps read and write
ZooKeeper: a LedgerClient opens its event loop and gRPC transport at its first call to a storage node
(api.LedgerClient._node_io), and the client package loads its modules on first use, so these steps never import
gRPC, asyncio, crc32c or prometheus_client (about 0.2 CPU s in each new worker). Here a fresh interpreter runs the
steps, as those workers do, against a real cluster.
"""
from __future__ import annotations

import subprocess
import sys

from connector.client import LedgerClient, Streams

HEAVY = ("grpc", "asyncio", "crc32c", "prometheus_client")

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
