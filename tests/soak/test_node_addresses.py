"""LedgerClient(node_addresses=...): the client dials the given address of a node (a proxy in front of it)
instead of the registered one, so the soak can cut one writer off one node without touching the others."""
from __future__ import annotations

from connector.client import LedgerClient
from connector.soak.proxy import TcpProxy


def test_a_client_reaches_nodes_through_its_address_map_and_leaves_a_blackholed_node(cluster, metadata_uri):
    nodes = cluster(4)
    proxies = {n.node_id: TcpProxy("127.0.0.1", int(n.address.rsplit(":", 1)[1])).start() for n in nodes}
    try:
        addresses = {node_id: proxy.address for node_id, proxy in proxies.items()}
        with LedgerClient(metadata_uri, timeout=2.0, add_timeout=2.0, node_addresses=addresses) as client:
            writer = client.create_ledger(3, 3, 2)
            assert writer.append(b"through the proxies") == 0
            ensemble = writer.metadata.last_fragment.ensemble
            assert all(proxies[n].stats().forwarded["c2s"] > 0 for n in ensemble)
            cut_off = ensemble[0]
            proxies[cut_off].set_mode("blackhole")
            proxies[cut_off].reset()
            assert writer.append(b"after the blackhole") == 1
            assert cut_off not in writer.metadata.last_fragment.ensemble
            writer.close()
            assert [e.payload for e in client.open_ledger(writer.ledger_id).read()] == [
                b"through the proxies", b"after the blackhole"]
    finally:
        for proxy in proxies.values():
            proxy.close()
