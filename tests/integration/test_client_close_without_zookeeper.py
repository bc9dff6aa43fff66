"""A LedgerClient closes at once while ZooKeeper is unreachable (issue 15 item 4: a client closing during an
outage used to hang until ZooKeeper came back, then, with the outage bound, raised after it and left its
session open). Its writer's liveness znode ends with its session: at once when ZooKeeper is reachable."""
from __future__ import annotations

import threading

import pytest

from connector.client import LedgerClient
from connector.soak.proxy import TcpProxy
from metadata import layout
from metadata.store import MetadataStore
from tests.harness.poll import poll_until


@pytest.fixture
def proxied_uri(metadata_uri, zookeeper):
    with TcpProxy(zookeeper.host, zookeeper.port) as proxy:
        yield proxy, metadata_uri.replace(zookeeper.address, proxy.address)


def test_close_during_an_outage_returns_at_once_and_closes_the_session(proxied_uri, metadata_uri, cluster):
    cluster(3)
    proxy, uri = proxied_uri
    client = LedgerClient(uri)
    with client.create_ledger(3, 3, 2) as writer:
        writer.append(b"before the outage")
    proxy.set_mode("blackhole")
    errors: list[BaseException] = []

    def close():
        try:
            client.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    closing = threading.Thread(target=close, daemon=True)
    closing.start()
    poll_until(lambda: not closing.is_alive(), timeout=20, what="close() to return while ZooKeeper is away")
    assert errors == []
    assert not client.store.zk.connected


def test_a_closed_clients_writer_znode_goes_with_its_session(metadata_uri, cluster):
    cluster(3)
    client = LedgerClient(metadata_uri)
    path = layout.writer_path(client.writer_id)
    with MetadataStore(metadata_uri) as store:
        assert store.exists(path)
        client.close()
        poll_until(lambda: not store.exists(path), timeout=10, what="the writer znode to go with the session")
