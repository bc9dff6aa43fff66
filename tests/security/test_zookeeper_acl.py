"""ZooKeeper digest ACLs: with credentials the whole metadata tree (root, layout, ledgers, streams, node
registrations, id allocation) is created readable and writable only by those credentials; the secret never
shows in str(), repr() or error messages."""
from __future__ import annotations

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from connector.client import LedgerClient, Streams
from metadata import layout
from metadata.errors import InvalidMetadataUriError, MetadataError
from metadata.store import MetadataStore, MetadataUri

SECRET = "zk-s3cret"


@pytest.fixture
def protected_uri(zookeeper, metadata_uri) -> str:
    """The test's fresh root, with credentials in the URI."""
    return metadata_uri.replace("zk://", f"zk://ledger:{SECRET}@", 1)


@pytest.fixture
def anonymous(zookeeper):
    client = KazooClient(hosts=zookeeper.address)
    client.start(timeout=15)
    yield client
    client.stop()
    client.close()


@pytest.mark.root_credentials(f"ledger:{SECRET}")  # `ledger init` with them: the whole tree is theirs
def test_an_unauthenticated_client_can_neither_read_nor_change_any_metadata(protected_uri, anonymous, start_node,
                                                                            monkeypatch):
    root = MetadataUri.parse(protected_uri).root
    monkeypatch.setenv("LEDGER_ZK_AUTH", f"ledger:{SECRET}")  # the nodes take it from the environment
    for _ in range(3):
        start_node()  # registers itself (ephemeral znode) and its cookie
    monkeypatch.delenv("LEDGER_ZK_AUTH")
    with LedgerClient(protected_uri) as lc:
        with lc.create_ledger(2, 2, 2, password=b"pw") as w:
            w.append(b"protected")
        with Streams(lc).open_writer("events") as sw:
            sw.append(b"stream entry")
        assert [e.payload for e in lc.open_ledger(w.ledger_id, password=b"pw").read(0, 0)] == [b"protected"]
        ledger_path = f"{root}{layout.ledger_path(w.ledger_id)}"
    with MetadataStore(protected_uri) as store:
        protected = [root, ledger_path, f"{root}{layout.MARKER}"] + [f"{root}{d}" for d in layout.ALL_DIRS]
        protected += [f"{root}{layout.FEATURES}", f"{root}{layout.COPY_DROPS}"]   # a node's GC reads the feature
        protected += [f"{root}{layout.NODES}/{n}" for n in store.zk.get_children(layout.NODES)]
        protected += [f"{root}{layout.STREAMS}/{n}" for n in store.zk.get_children(layout.STREAMS)]
    for path in protected:
        for refused in (lambda: anonymous.get(path), lambda: anonymous.get_children(path),
                        lambda: anonymous.set(path, b"vandalised"), lambda: anonymous.delete(path, recursive=True),
                        lambda: anonymous.create(f"{path}/intruder", b"")):
            with pytest.raises(NoAuthError):
                refused()
    wrong = protected_uri.replace(SECRET, "guess")
    with pytest.raises(MetadataError, match="ACLs") as denied:
        with LedgerClient(wrong):
            pass
    assert "guess" not in str(denied.value) and SECRET not in str(denied.value)
    with pytest.raises(MetadataError, match="ACLs"):
        MetadataStore(protected_uri.replace(f"ledger:{SECRET}@", "")).list_ledgers()
    with LedgerClient(protected_uri) as lc:  # the data is still there for the rightful owner
        assert [e.payload for e in lc.open_ledger(w.ledger_id, password=b"pw").read(0, 0)] == [b"protected"]


@pytest.mark.root_credentials(f"ledger:{SECRET}")
def test_credentials_can_come_from_the_environment(zookeeper, metadata_uri, anonymous, monkeypatch):
    monkeypatch.setenv("LEDGER_ZK_AUTH", f"ledger:{SECRET}")
    with MetadataStore(metadata_uri) as store:
        ledger_id = store.allocate_ledger_id()
        assert store.credentials.user == "ledger"
    with pytest.raises(NoAuthError):
        anonymous.get_children(MetadataUri.parse(metadata_uri).root)
    assert ledger_id >= 0
    monkeypatch.setenv("LEDGER_ZK_AUTH", "no-colon")
    with pytest.raises(InvalidMetadataUriError, match="user:secret"):
        MetadataStore(metadata_uri)


def test_credentials_on_a_root_created_without_them_are_refused(metadata_uri, store):
    with pytest.raises(MetadataError, match="created without credentials"):
        MetadataStore(metadata_uri.replace("zk://", f"zk://ledger:{SECRET}@", 1))


def test_the_secret_is_redacted_everywhere_it_could_be_printed(protected_uri):
    uri = MetadataUri.parse(protected_uri)
    assert SECRET not in str(uri) and SECRET not in repr(uri) and "ledger:***@" in str(uri)
    assert SECRET in uri.uri() and MetadataUri.parse(uri.uri()) == uri
    with pytest.raises(InvalidMetadataUriError) as bad:
        MetadataUri.parse(f"zk://ledger:{SECRET}@127.0.0.1:2181")  # no root
    assert SECRET not in str(bad.value)
