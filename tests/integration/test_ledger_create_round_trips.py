"""What a new client's first ledger costs in ZooKeeper requests (issue 17: the fixed cost of a Spark write task, whose
client is new and writes one ledger): the placement's listings and registrations are read at once (pipelined), the
transport dials the nodes the placement just read without reading them again, and the id's sequential znode is
deleted without waiting. Before: each registration read in turn, then the transport listing them all again and
reading each node it dialled after the first once more: 8 registration reads instead of 3."""
from kazoo.client import KazooClient

from connector.client import LedgerClient
from metadata import layout


def test_a_new_clients_first_ledger_reads_each_node_registration_once(cluster, metadata_uri, monkeypatch):
    cluster(3)
    reads: list[str] = []
    real = KazooClient.get_async

    def get_async(zk, path, *args, **kwargs):   # every read of a znode's data, kazoo's get() included
        reads.append(path)
        return real(zk, path, *args, **kwargs)

    with LedgerClient(metadata_uri) as client:
        monkeypatch.setattr(KazooClient, "get_async", get_async)
        with client.create_ledger(3, 3, 2) as handle:
            assert [handle.append(b"x%d" % i) for i in range(3)] == [0, 1, 2]
        monkeypatch.setattr(KazooClient, "get_async", real)
    registrations = sorted(path for path in reads if path.startswith(layout.NODES + "/"))
    assert registrations == sorted({*registrations}) and len(registrations) == 3, reads
