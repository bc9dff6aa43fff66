"""Who is alive: storage node registrations, node cookies and writer-liveness znodes.

Registrations and writer znodes are ephemeral: they vanish with the ZooKeeper session of their
owner. A session that expires (a long pause, a partition) is re-registered when a new one starts.
These are hints for placement and for telling dead writers from live ones; safety always comes
from fencing (DESIGN rule 14).
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Callable, Iterable

from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.protocol.states import KazooState

from metadata import layout, serde
from metadata.errors import LedgerError, MetadataConflictError
from metadata.model import Cookie, NodeRegistration, Versioned
from metadata.store import MetadataStore

log = logging.getLogger(__name__)


class InvalidNodeIdError(LedgerError):
    """A storage node id that breaks layout.NODE_ID_RULE: no node can have it."""


def check_node_id(node_id: str) -> str:
    """node_id, or InvalidNodeIdError naming the rule: for a command's argument, before ZooKeeper is asked (which
    refuses '..' in its own words, and waited a minute on bytes that are not UTF-8)."""
    if not layout.is_node_id(node_id):
        raise InvalidNodeIdError(f"{node_id!r} is not a storage node id (ids are {layout.NODE_ID_RULE}); check the "
                                 "id with `ledger cluster status`")
    return node_id


class EphemeralRegistration:
    """Keeps one ephemeral znode in place, with the latest data, re-creating it after the session is lost.

    An outage longer than the session timeout expires the session and ZooKeeper deletes the znode; kazoo then
    starts a new session, and its CONNECTED event re-creates the znode. Data set by update() while ZooKeeper
    was away (a node turning read-only) is written once it is back, whether the session survived or not.

    Every write (an update's, a reconnect's) reads the latest data and sends it under one lock, so a write of
    older data can never land after a newer one (the znode's writes are unversioned).
    """

    def __init__(self, store: MetadataStore, path: str, data: bytes):
        self._store = store
        self._path = path
        self._data = data
        self._lock = threading.Lock()        # _data and _stale
        self._writing = threading.RLock()    # one write at a time, each of the data latest when it is sent
        self._closed = False
        self._stale = False  # the znode may hold older data than _data (an update that did not reach it)
        self._put()
        store.add_listener(self._on_state)

    def update(self, data: bytes) -> None:
        with self._lock:
            self._data = data
            self._stale = True
        self._publish()

    def close(self) -> None:
        self._closed = True
        self._store.remove_listener(self._on_state)
        self._store.delete(self._path)

    def end_with_session(self) -> None:
        """Stop keeping the znode in place without deleting it: the owner is about to close its session, which
        removes exactly the ephemeral znodes that session owns, at once when ZooKeeper is reachable, at the
        session's expiry when it is not. Unlike close(), this never waits for ZooKeeper."""
        self._closed = True
        self._store.remove_listener(self._on_state)

    def _publish(self) -> None:
        with self._writing:
            with self._lock:
                data = self._data
            try:
                self._store.set_data(self._path, data)
            except NoNodeError:
                self._put()
                return
            self._written(data)

    def _put(self) -> None:
        with self._writing:
            with self._lock:
                data = self._data
            try:
                self._store.create(self._path, data, ephemeral=True)
            except NodeExistsError:
                # Left over from our own previous session until ZooKeeper expires it: replace it.
                self._store.delete(self._path)
                self._store.create(self._path, data, ephemeral=True)
            self._written(data)

    def _written(self, data: bytes) -> None:
        with self._lock:
            if self._data == data:
                self._stale = False

    def _on_state(self, state: str) -> None:
        if self._closed:
            return
        if state == KazooState.SUSPENDED:
            log.warning("ZooKeeper connection lost: %s stays registered until the session expires", self._path)
        elif state == KazooState.LOST:
            log.warning("ZooKeeper session expired: %s is gone until ZooKeeper is back", self._path)
        elif state == KazooState.CONNECTED:
            # kazoo calls listeners on its event thread, where blocking calls would deadlock.
            threading.Thread(target=self._reregister, daemon=True).start()

    def _reregister(self) -> None:
        try:
            if self._closed:
                return
            with self._writing:
                if not self._store.exists(self._path):
                    self._put()
                elif self._stale:
                    self._publish()
        except Exception as exc:  # the next reconnect tries again
            log.warning("ephemeral registration %s not restored yet (tried again on the next reconnect): %s",
                        self._path, exc)


def register_node(store: MetadataStore, reg: NodeRegistration) -> EphemeralRegistration:
    return EphemeralRegistration(store, layout.node_path(reg.node_id), serde.encode_node(reg))


def list_nodes(store: MetadataStore, within: float | None = None) -> dict[str, NodeRegistration]:
    """The registered nodes. within: one attempt, the listing and then every registration read at once
    (pipelined), each waiting at most that long (MetadataError past it), for a caller that must not wait for
    ZooKeeper (the client's event loop). Either way the registrations are read at once (pipelined)."""
    if within is None:
        node_ids = store.children(layout.NODES)
        return _registered(node_ids, store.read_many([layout.node_path(n) for n in node_ids], serde.decode_node))
    node_ids = store.children_within(layout.NODES, within)
    return _registered(node_ids, store.read_many_within([layout.node_path(n) for n in node_ids],
                                                        serde.decode_node, within))


def _registered(node_ids: list[str], read: list[Versioned | None]) -> dict[str, NodeRegistration]:
    return {node_id: one.value for node_id, one in zip(node_ids, read) if one is not None}


def read_node(store: MetadataStore, node_id: str, within: float | None = None) -> NodeRegistration | None:
    """The node's registration now, None while it is not registered. within: one attempt that waits at most
    that long (MetadataStore.read_within)."""
    path = layout.node_path(node_id)
    found = store.read(path, serde.decode_node) if within is None else store.read_within(path, serde.decode_node,
                                                                                         within)
    return found.value if found is not None else None


def read_cookie(store: MetadataStore, node_id: str) -> Versioned[Cookie] | None:
    return store.read(layout.cookie_path(node_id), serde.decode_cookie)


def create_cookie(store: MetadataStore, cookie: Cookie) -> None:
    try:
        store.create(layout.cookie_path(cookie.node_id), serde.encode_cookie(cookie))
    except NodeExistsError as exc:
        raise MetadataConflictError(
            f"a cookie for node {cookie.node_id} exists already in ZooKeeper; another node has that id"
        ) from exc


def delete_cookie(store: MetadataStore, node_id: str) -> None:
    store.delete(layout.cookie_path(node_id))


def register_writer(store: MetadataStore, writer_id: str) -> EphemeralRegistration:
    return EphemeralRegistration(store, layout.writer_path(writer_id), b"")


def writer_alive(store: MetadataStore, writer_id: str, watch: Callable | None = None) -> bool:
    """Whether writer_id is registered. watch(event), if given, is called once (on kazoo's event thread) when the
    registration appears or goes (a ZooKeeper watch; pass the same function each time, so that it is set once)."""
    return bool(writer_id) and store.exists(layout.writer_path(writer_id), watch=watch)


def writers_alive(store: MetadataStore, writer_ids: Iterable[str]) -> set[str]:
    """Those of writer_ids that are registered (writer_alive of each), read at once (pipelined)."""
    ids = sorted({writer_id for writer_id in writer_ids if writer_id})
    return {writer_id for writer_id, there in zip(ids, store.exist([layout.writer_path(w) for w in ids])) if there}


def mark_decommissioned(store: MetadataStore, node_id: str) -> None:
    """Retire a node for good (persistent, idempotent): placement stops choosing it and the audit counts
    every fragment on it as under-replicated until its data is copied elsewhere. The mark advances the
    placement epoch (the data version of /decommissioned) in the same multi, so that no write of nodes chosen
    before it can land after it (Placement)."""
    request = store.transaction()
    request.create(layout.decommissioned_path(node_id))
    request.set_data(layout.DECOMMISSIONED, b"")
    try:
        request.commit()
    except NodeExistsError:     # marked before: advanced again all the same (a mark made by an older version)
        store.set_data(layout.DECOMMISSIONED, b"")


def decommissioned_nodes(store: MetadataStore) -> set[str]:
    return set(store.children(layout.DECOMMISSIONED))


@dataclasses.dataclass(frozen=True)
class Placement:
    """The nodes new ensembles and replacements may use (registered, not decommissioned), and the placement
    epoch they were read at. A write that names nodes chosen from them (a ledger's creation, an ensemble change,
    a recovery's close that stores its write-back's changes, a re-replication) passes the epoch: the store
    checks it in the write's own multi and refuses the write (PlacementChangedError) if a node was marked
    decommissioned since. So once a decommission's scan finds no ledger naming the node, none ever will."""
    nodes: dict[str, NodeRegistration]
    epoch: int | None        # None: unchecked (a simulation's registry)
    registered: dict[str, NodeRegistration] = dataclasses.field(default_factory=dict)  # decommissioned ones too


def placement(store: MetadataStore) -> Placement:
    """Both listings in one round trip, then every registration in another (pipelined)."""
    decommissioned, listed = store.listings([layout.DECOMMISSIONED, layout.NODES])
    retired, stat = decommissioned   # both made with the layout, never deleted
    registered = _registered(listed[0], store.read_many([layout.node_path(n) for n in listed[0]], serde.decode_node))
    return Placement({node_id: reg for node_id, reg in registered.items() if node_id not in retired}, stat.version,
                     registered)


def placeable_nodes(store: MetadataStore) -> dict[str, NodeRegistration]:
    """Registered nodes that new ensembles and replacements may use: decommissioned ones are left out."""
    return placement(store).nodes


def set_readonly(store: MetadataStore, node_id: str, on: bool) -> None:
    """The operator's drain switch (seed 002): a persistent flag the node watches; idempotent both ways."""
    path = layout.readonly_path(node_id)
    if not on:
        store.delete(path)
        return
    try:
        store.create(path, makepath=True)
    except NodeExistsError:
        pass


def readonly_requested(store: MetadataStore, node_id: str) -> bool:
    return store.exists(layout.readonly_path(node_id))


def watch_readonly(store: MetadataStore, node_id: str, on_change: Callable[[bool], None]) -> None:
    """Call on_change(flag set?) now and on every change, across reconnects (on kazoo's thread)."""
    def changed(data, stat, event=None) -> None:
        on_change(stat is not None)

    store.watch_data(layout.readonly_path(node_id), changed)
