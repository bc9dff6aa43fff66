"""Ledger id allocation leaves no /idgen znodes behind (metadata/ledger_ids.py), against a real ZooKeeper.

Growth audit 2026-11-29: an allocation created a persistent sequential znode and deleted it in a second request; a
lost reply or a process dying in between left it for good, and every new client lists /idgen on its first
allocation (a Spark write task opens one per task)."""
import pytest
from kazoo.exceptions import ConnectionLoss

from metadata import layout, ledger_ids
from metadata.errors import MetadataError
from metadata.store import MetadataStore
from tests.harness.poll import poll_until


def id_znodes(store) -> list[str]:
    return sorted(name for name in store.children(layout.IDGEN) if name.startswith("id-"))


def sequence(name: str) -> int:
    return ledger_ids.sequence_of(f"{layout.IDGEN}/{name}")


def old_version_leftover(store) -> str:
    """What an older version's allocation left when its delete never came: a persistent sequential znode."""
    return store.zk.create(f"{layout.IDGEN}/id-", b"", sequence=True).rsplit("/", 1)[1]


def test_an_allocation_whose_create_reply_was_lost_leaves_nothing_once_its_session_ends(metadata_uri, monkeypatch):
    with MetadataStore(metadata_uri) as lost:
        real_create = lost.zk.create

        def created_but_reply_lost(path, *args, **kwargs):
            real_create(path, *args, **kwargs)
            raise ConnectionLoss()

        monkeypatch.setattr(lost.zk, "create", created_but_reply_lost)
        for _ in range(3):
            with pytest.raises(MetadataError):
                lost.allocate_ledger_id()
        assert len(id_znodes(lost)) == 3
    with MetadataStore(metadata_uri) as other:
        poll_until(lambda: id_znodes(other) == [], 10, what="the lost allocations' znodes to go with their session")


def test_a_failed_delete_does_not_fail_the_allocation(store, monkeypatch):
    def reply_lost(path, *args, **kwargs):
        raise ConnectionLoss()

    first = store.allocate_ledger_id()
    monkeypatch.setattr(store, "wait_seconds", 0.5)
    monkeypatch.setattr(store.zk, "delete", reply_lost)
    second = store.allocate_ledger_id()
    monkeypatch.undo()
    assert first < second < store.allocate_ledger_id()


def test_persistent_leftovers_of_older_versions_are_removed_and_ids_never_repeat(store, metadata_uri):
    old = [old_version_leftover(store) for _ in range(3)]
    taken = [store.allocate_ledger_id(), *store.allocate_ledger_ids(3, per_request=2)]
    old.append(old_version_leftover(store))
    with MetadataStore(metadata_uri) as in_flight:   # another client between its create and its delete
        busy = in_flight.zk.create(f"{layout.IDGEN}/id-", b"", ephemeral=True, sequence=True).rsplit("/", 1)[1]
        with MetadataStore(metadata_uri) as fresh:
            fresh._ledger_ids = ledger_ids.LedgerIds(fresh, leftover_grace=0.0)
            taken.append(fresh.allocate_ledger_id())
            assert id_znodes(fresh) == [busy]
            taken += [fresh.allocate_ledger_id(), *fresh.allocate_ledger_ids(2, per_request=2)]
    assert id_znodes(store) == []
    everything = taken + [sequence(name) for name in old + [busy]]
    assert len(set(everything)) == len(everything)
    assert taken[4:] == sorted(taken[4:]) and taken[4] > max(taken[:4] + [sequence(name) for name in old + [busy]])
    assert store.allocate_ledger_id() > max(everything)


def test_a_young_persistent_id_znode_may_be_an_older_client_in_flight_and_is_kept(store, metadata_uri):
    young = old_version_leftover(store)
    with MetadataStore(metadata_uri) as fresh:
        assert fresh.allocate_ledger_id() > sequence(young)
    assert id_znodes(store) == [young]


@pytest.mark.root_credentials("ledger:s3cret")
def test_on_a_protected_root_the_id_znodes_carry_its_acl_and_leftovers_are_still_removed(metadata_uri, monkeypatch):
    protected_uri = metadata_uri.replace("zk://", "zk://ledger:s3cret@", 1)
    with MetadataStore(protected_uri) as store:
        old = old_version_leftover(store)
        real_create = store.zk.create
        created = []

        def created_but_reply_lost(path, *args, **kwargs):
            created.append(real_create(path, *args, **kwargs))
            raise ConnectionLoss()

        monkeypatch.setattr(store.zk, "create", created_but_reply_lost)
        with pytest.raises(MetadataError):
            store.allocate_ledger_id()
        monkeypatch.undo()
        acls, _ = store.zk.get_acls(created[0])
        assert [acl.id.scheme for acl in acls] == ["digest"] and store.zk.exists(created[0]).ephemeralOwner
        with MetadataStore(protected_uri) as fresh:
            fresh._ledger_ids = ledger_ids.LedgerIds(fresh, leftover_grace=0.0)
            assert fresh.allocate_ledger_id() > sequence(old)
            assert old not in id_znodes(fresh)
