"""The ledger's compare-and-set loop after a write whose reply was lost (metadata/update_loop.py, DESIGN
rules 3, 4, 12 and 16), against a real ZooKeeper: the write may have landed or not, so the loop syncs,
re-reads and decides again; a close or an ensemble change that landed is found in the record and is never
applied twice, one that did not land is written then. The reply is lost on purpose by a store that raises,
around the real write, the error a dropped connection gives (kazoo's ConnectionLoss as the cause)."""
from __future__ import annotations

import pytest
from kazoo.exceptions import ConnectionLoss

from connector.client.ops.close import close_own, close_recovered
from connector.client.ops.ensemble_change import change_ensemble
from metadata.errors import MetadataError
from metadata.model import Fragment, LedgerMetadata, LedgerState, NodeRegistration
from metadata.store import MetadataStore
from metadata.update_loop import update_ledger
from protos.digest import password_hash

NODES = {n: NodeRegistration(n, f"127.0.0.1:{port}") for n, port in (("a", 1), ("b", 2), ("c", 3), ("d", 4))}


class LosingStore(MetadataStore):
    """Loses the reply of the next write_ledger: after it landed (`after`) or before it was sent."""

    lose: str | None = None
    writes = 0

    def write_ledger(self, meta, expected_version, placement_epoch=None):
        self.writes += 1
        lose, self.lose = self.lose, None
        if lose == "before":
            raise MetadataError("connection lost before the request reached ZooKeeper") from ConnectionLoss()
        stored = super().write_ledger(meta, expected_version, placement_epoch)
        if lose == "after":
            raise MetadataError("connection lost before the reply") from ConnectionLoss()
        return stored


@pytest.fixture
def store(metadata_uri):
    with LosingStore(metadata_uri) as s:
        yield s


def open_ledger(store: LosingStore):
    return store.create_ledger(LedgerMetadata(0, 3, 3, 2, (Fragment(0, ("a", "b", "c")),),
                                              password_hash=password_hash(b"")))


@pytest.mark.parametrize("lose", ["after", "before"])
def test_a_close_whose_reply_was_lost_is_found_or_written_once(store, lose):
    created = open_ledger(store)
    store.lose = lose
    stored = update_ledger(store, created.value.ledger_id, close_own(created.value.ledger_id, 4, 500), created)
    assert stored.value.state is LedgerState.CLOSED and stored.value.last_entry_id == 4
    reread = store.read_ledger(created.value.ledger_id)
    assert reread == stored and reread.version == created.version + 1   # closed exactly once
    assert store.writes == (1 if lose == "after" else 2)


@pytest.mark.parametrize("lose", ["after", "before"])
def test_an_ensemble_change_whose_reply_was_lost_is_found_or_written_once(store, lose):
    created = open_ledger(store)
    store.lose = lose
    stored = update_ledger(store, created.value.ledger_id, change_ensemble({"b"}, 5, NODES), created)
    fragments = store.read_ledger(created.value.ledger_id).value.fragments
    assert len(fragments) == 2 and fragments[1].first_entry_id == 5 and "b" not in fragments[1].ensemble
    assert stored.value.fragments == fragments and stored.version == created.version + 1   # one change, kept


@pytest.mark.parametrize("lose", ["after", "before"])
def test_a_recoverys_close_whose_reply_was_lost_keeps_its_write_back_fragments_once(store, lose):
    """Rule 12: the closing CAS stores the write-back's ensemble change with the close; found after a lost
    reply, it is adopted as stored, not written again."""
    created = open_ledger(store)
    ledger_id = created.value.ledger_id
    in_recovery = store.write_ledger(created.value.replace(state=LedgerState.IN_RECOVERY), created.version)
    read = in_recovery.value.fragments
    write_back = read + (Fragment(3, ("a", "d", "c")),)
    store.lose = lose
    stored = update_ledger(store, ledger_id, close_recovered(6, 700, read, write_back), in_recovery)
    reread = store.read_ledger(ledger_id)
    assert reread == stored and reread.version == in_recovery.version + 1
    assert reread.value.state is LedgerState.CLOSED and reread.value.last_entry_id == 6
    assert reread.value.fragments == write_back
