"""Rule 7 at a ledger's first sight: a node binds only the master key that the ledger's metadata names.

A node binds a ledger's master key on the first add, fence or WriteLac naming the ledger, and from then on compares
every request's key with it (ledger_state.py). Bound unchecked, as BookKeeper's bookies bind it, the first key
wins: a client holding the node token could claim ids not created yet (or not yet seen by this node) with a key of
its own, and the ledger's creator would be refused on that node. So before binding, the node reads the ledger's
metadata, which its creator writes before any add (and keeps only sha256(master key): protos/digest.py
password_hash), and binds the key only if it hashes to that. Once per ledger per node: later requests compare with
the bound key, and a restart keeps the bindings (journal and checkpoints).

- the key hashes to the metadata's password_hash: None, the caller binds it;
- another key: UNAUTHORIZED, as a key other than the bound one gets;
- no metadata (never created, or deleted; read again after a ZooKeeper sync before this is believed, so a session
  on a lagging follower cannot refuse a ledger just created): UNAUTHORIZED, nothing bound;
- no answer within LOOKUP_SECONDS (ZooKeeper away: a request that got no reply, on a lost connection or an expired
  session, is sent again meanwhile, so a node that reconnects a moment after ZooKeeper is back, or renews its
  session, still answers), or a record that cannot be decoded: ERROR, which the client takes as this node failing
  (an ensemble change, another node for a recovery) and never as a negative; the key is not bound unchecked.

The read is kazoo's asynchronous one: the event loop never waits for ZooKeeper, and the requests that find the
same ledger new at once share one read. Metadata found answers every request that waited for it (a ledger's
password hash never changes, and ids are never used again), but "no metadata" only those that arrived before its
read began: a creator writes the metadata before its first add, so a read that began before that add arrived, as
one for a request of somebody else's may have, can miss a ledger created since; such a request asks again.
Nothing is kept once answered: a refused id may be created later, and an admitted key is bound by then.
"""
from __future__ import annotations

import asyncio
import hmac
import itertools

from prometheus_client import Counter

from metadata.errors import MetadataError
from metadata.model import LedgerMetadata, Versioned
from metadata.store import MetadataStore, no_reply
from protos import ledger_pb2 as pb
from protos.digest import key_hash
from storage_node.ledger_state import Refusal, Verdict

# The most a first sight waits for ZooKeeper's answers (a sync and a second read included): less than a client waits
# for a fence or read (LedgerClient's timeout, 5 s), so that it hears ERROR from this node rather than nothing.
LOOKUP_SECONDS = 4.0
RETRY_PAUSE = 0.1          # before a read that got no reply is sent again (kazoo reconnects meanwhile)


def first_sight_verdict(ledger_id: int, key: bytes, meta: LedgerMetadata | None) -> Verdict:
    """Whether key may be bound to ledger_id, new to this node, given the ledger's metadata (None: there is none)."""
    if meta is None:
        return Refusal(pb.UNAUTHORIZED, f"ledger {ledger_id} has no metadata (not created yet, or deleted): no master "
                                        "key is bound to it; ledgers are created by the client, which writes their "
                                        "metadata before any add")
    if not hmac.compare_digest(key_hash(key), meta.password_hash):
        return Refusal(pb.UNAUTHORIZED, f"wrong password for ledger {ledger_id}: the master key does not match the "
                                        "password hash in the ledger's metadata; open it with the password it was "
                                        "created with")
    return None


class KeyCheck:
    """The first-sight check of one node, against the metadata store of its ZooKeeper session; lookups counts each
    metadata read by outcome (found, absent, failed)."""

    def __init__(self, store: MetadataStore, node_id: str, lookups: Counter | None = None):
        self._store = store
        self._node_id = node_id
        self._counted = lookups
        self._lookups: dict[int, tuple[int, asyncio.Future]] = {}   # ledger id -> (when, its read in flight)
        self._clock = itertools.count()     # orders arrivals and the starts of reads

    async def verdict(self, ledger_id: int, key: bytes) -> Verdict:
        """None when key may be bound to ledger_id, which this node does not hold; else the refusal to answer."""
        arrived, answered = next(self._clock), -1    # answered: the start of the read last found too early
        while True:
            current = self._lookups.get(ledger_id)
            started, lookup = current if current is not None and current[0] > answered else self._start(ledger_id)
            try:
                meta = await asyncio.shield(lookup)     # a caller that goes away leaves the read to the others
            except Exception as exc:
                why = f"no answer within {LOOKUP_SECONDS:.0f} s" if isinstance(exc, TimeoutError) else exc
                return Refusal(pb.ERROR, f"node {self._node_id} cannot check the master key of ledger {ledger_id}, "
                                         f"new to it, against the ledger's metadata ({why}); it binds no key "
                                         "unchecked: retry, or write to another node")
            if meta is not None or started > arrived:
                return first_sight_verdict(ledger_id, key, None if meta is None else meta.value)
            answered = started

    def _start(self, ledger_id: int) -> tuple[int, asyncio.Future]:
        lookup = asyncio.ensure_future(self._read(ledger_id))
        self._lookups[ledger_id] = started = (next(self._clock), lookup)
        lookup.add_done_callback(lambda done: self._forget(ledger_id, started))
        return started

    async def _read(self, ledger_id: int) -> Versioned[LedgerMetadata] | None:
        try:
            async with asyncio.timeout(LOOKUP_SECONDS):
                found = await self._answered(ledger_id, synced=False)
                if found is None:        # or a follower that has not applied its creation yet: ask after a sync
                    found = await self._answered(ledger_id, synced=True)
        except Exception:
            self._count("failed")
            raise
        self._count("absent" if found is None else "found")
        return found

    async def _answered(self, ledger_id: int, synced: bool) -> Versioned[LedgerMetadata] | None:
        """One read of the ledger's metadata, sent again while it gets no reply (the caller bounds the time)."""
        while True:
            try:
                return await asyncio.wrap_future(self._store.read_ledger_async(ledger_id, synced=synced))
            except MetadataError as exc:
                if not no_reply(exc):
                    raise
            await asyncio.sleep(RETRY_PAUSE)

    def _count(self, outcome: str) -> None:
        if self._counted is not None:
            self._counted.labels(outcome).inc()

    def _forget(self, ledger_id: int, started: tuple[int, asyncio.Future]) -> None:
        if self._lookups.get(ledger_id) is started:
            del self._lookups[ledger_id]
        done = started[1]
        if not done.cancelled():
            done.exception()     # retrieved here when every waiter went away: no "never retrieved" warning
