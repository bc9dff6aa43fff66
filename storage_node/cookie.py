"""The cookie: a node's identity, kept in ZooKeeper, in its data directory and in every directory it writes.

A node whose directory was wiped, swapped with another node's, or pointed at another cluster would
answer "no such entry" for entries it acknowledged before; so it refuses to start instead. The fix
is never to delete the cookie: decommission the node and start a fresh one under a new id.

DESIGN rule 8: every directory the node writes carries the check, not only the top one. If `COOKIE`
survived but `journal/` was lost (deleted, emptied, a volume not mounted), replay would find an empty
journal and the node would answer NO_LEDGER for what it acknowledged. So:

- `journal/COOKIE` is a copy of the cookie (the same instance id). It differs: refused. It is missing:
  written when the node has never served (ZooKeeper had no cookie for it yet, so nothing was ever
  acknowledged) or when the journal holds journal files (a directory from before journal cookies:
  migrated once); refused otherwise, because then the journal was lost. That rule also refuses a
  directory from before journal cookies that has a COOKIE but no journal file at all: a lost journal
  looks exactly like that, and since every start opens a journal segment, only a node that never got
  as far as opening its journal (and so holds nothing) can be in that state legitimately; decommission
  it and start an empty directory under a new node id.
- The snapshot is a file in the data directory; its COOKIE records `"snapshot": true` once one has
  been written (the node writes one on its first start), and a snapshot is only ever replaced, never
  removed. A recorded snapshot that is missing is refused, and so is a journal directory without any
  journal file once a snapshot was recorded (its files were deleted but the cookie was left).

On a first start the journal cookie is written before `COOKIE`, and that before ZooKeeper's cookie, so
a crash between any two steps starts again cleanly. The node binds its ports before it gets here
(storage_node/node.py), so a node that cannot listen writes no cookie at all. A cookie in ZooKeeper that
names another directory, where that instance provably never served, is released for the node to start
afresh (release_unserved_cookie): left behind by a start that failed half-way, it would otherwise refuse
every later start of that node id (issue 15 item 7).
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time
import uuid
from typing import Callable

from kazoo.exceptions import BadVersionError, NoNodeError

from metadata import layout, registry
from metadata.model import Cookie, Versioned
from metadata.store import MetadataStore
from storage_node.checkpoint import SNAPSHOT_NAME
from storage_node.data_dir_lock import DataDirInUseError, DataDirLock
from storage_node.errors import CookieMismatchError, StorageNodeError
from storage_node.file_modes import new_file, private_directory
from storage_node.segments import JOURNAL_DIR, fsync_directory, list_compacted, list_segments

COOKIE_NAME = "COOKIE"
SNAPSHOT_RECORDED = "snapshot"      # key of the data directory's COOKIE: a snapshot has been written
_COOKIE_FIELDS = tuple(f.name for f in dataclasses.fields(Cookie))
_WHAT_TO_DO = ("restore the node's original data directory, or decommission node {node} (re-replicate its "
               "ledgers) and start an empty directory under a new node id; never delete the cookie")


def read_disk_cookie(directory: pathlib.Path) -> Cookie | None:
    """The cookie in directory (the data directory or the journal), None if it has none."""
    fields = _read_fields(directory)
    return None if fields is None else Cookie(*(fields[name] for name in _COOKIE_FIELDS))


def _read_fields(directory: pathlib.Path) -> dict | None:
    path = directory / COOKIE_NAME
    try:
        fields = json.loads(path.read_text())
        if not isinstance(fields, dict) or not set(_COOKIE_FIELDS) <= fields.keys():
            raise ValueError(f"a cookie has the fields {', '.join(_COOKIE_FIELDS)}")
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise CookieMismatchError(
            f"the cookie file {path} is damaged ({exc}): the node cannot tell whose data this is; "
            + _WHAT_TO_DO.format(node="<its id>")
        ) from exc
    return fields


def write_disk_cookie(directory: pathlib.Path, cookie: Cookie) -> None:
    _write_fields(directory, dataclasses.asdict(cookie))


def _write_fields(directory: pathlib.Path, fields: dict) -> None:
    tmp = directory / (COOKIE_NAME + ".tmp")
    with open(tmp, "w", opener=new_file) as f:
        json.dump(fields, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / COOKIE_NAME)
    fsync_directory(directory)


def snapshot_recorded(data_dir: pathlib.Path) -> bool:
    fields = _read_fields(data_dir)
    return fields is not None and fields.get(SNAPSHOT_RECORDED) is True


def record_snapshot(data_dir: pathlib.Path) -> None:
    """Note in the data directory's COOKIE that a snapshot exists (call it once the snapshot is in place)."""
    fields = _read_fields(data_dir)
    if fields is not None and fields.get(SNAPSHOT_RECORDED) is not True:
        _write_fields(data_dir, {**fields, SNAPSHOT_RECORDED: True})


def journal_files(data_dir: pathlib.Path) -> bool:
    """Whether the journal directory holds a segment or compacted file."""
    journal = data_dir / JOURNAL_DIR
    return bool(list_segments(journal) or list_compacted(journal))


def holds_data(data_dir: pathlib.Path) -> bool:
    """Whether the directory has a journal file or snapshot (the node ran here before)."""
    return (data_dir / SNAPSHOT_NAME).exists() or journal_files(data_dir)


def check_cookie(store: MetadataStore, data_dir: pathlib.Path, node_id: str,
                 note: Callable[[str], None] = lambda text: None) -> Cookie:
    """The node's cookie once disk, ZooKeeper and every directory the node writes agree; creates all of
    them for a brand-new node. note(text) is told what was repaired on the way."""
    private_directory(data_dir)
    disk = read_disk_cookie(data_dir)
    found = registry.read_cookie(store, node_id)
    zk = found.value if found is not None else None
    todo = _WHAT_TO_DO.format(node=node_id)
    if disk is None and zk is not None and pathlib.Path(zk.data_dir).resolve() != data_dir.resolve():
        kept = release_unserved_cookie(store, found, data_dir)
        if kept:
            raise CookieMismatchError(
                f"data directory {data_dir} has no cookie, but node {node_id} was created in {zk.data_dir} "
                f"(ZooKeeper's cookie, instance {zk.instance_id}) and {kept}; start node {node_id} with "
                f"--data-dir {zk.data_dir}, or give {data_dir} a new node id; never delete the cookie"
            )
        note(f"ZooKeeper's cookie for node {node_id} (instance {zk.instance_id}) named {zk.data_dir}, where "
             f"that node never served (it holds no journal file and no snapshot, and no process has it): "
             f"released it; node {node_id} starts afresh in {data_dir}")
        zk = None
    if disk is None and zk is not None:
        raise CookieMismatchError(
            f"data directory {data_dir} has no cookie but ZooKeeper has a cookie for node {node_id} "
            f"(instance {zk.instance_id}, data directory {zk.data_dir}): the directory was wiped or swapped, "
            f"and serving it would deny entries this node acknowledged; {todo}"
        )
    if disk is not None and disk.node_id != node_id:
        raise CookieMismatchError(
            f"data directory {data_dir} holds the cookie of node {disk.node_id} (instance {disk.instance_id}), "
            f"not of node {node_id}: it belongs to another node; start node {disk.node_id} on it, or use "
            f"another directory for node {node_id}"
        )
    if disk is not None and zk is not None and disk.instance_id != zk.instance_id:
        raise CookieMismatchError(
            f"data directory {data_dir} holds cookie instance {disk.instance_id} of node {node_id}, but "
            f"ZooKeeper's cookie for node {node_id} is instance {zk.instance_id}: the directory was swapped "
            f"or belongs to an earlier incarnation of this node id; {todo}"
        )
    if disk is not None and zk is None:
        if holds_data(data_dir):
            raise CookieMismatchError(
                f"data directory {data_dir} holds node {node_id}'s cookie (instance {disk.instance_id}) and data, "
                f"but ZooKeeper at {store.uri} has no cookie for it: the node points at a different cluster, "
                f"or the metadata was wiped; point --metadata at the node's own cluster, or {todo}"
            )
        # A first start that stopped between writing the disk cookie and the ZooKeeper one.
        write_journal_cookie(data_dir, disk)
        registry.create_cookie(store, disk)
        return disk
    if disk is None:
        if holds_data(data_dir):
            raise CookieMismatchError(
                f"data directory {data_dir} holds journal data but no cookie, and ZooKeeper has none for node "
                f"{node_id}: the node cannot tell whose data this is; use an empty directory for a new node"
            )
        disk = Cookie(node_id, uuid.uuid4().hex, str(data_dir), time.time())
        write_journal_cookie(data_dir, disk)
        write_disk_cookie(data_dir, disk)
        registry.create_cookie(store, disk)
        return disk
    check_journal_cookie(data_dir, disk)
    check_snapshot(data_dir, disk)
    return disk


def release_unserved_cookie(store: MetadataStore, found: Versioned[Cookie], data_dir: pathlib.Path) -> str:
    """Delete ZooKeeper's cookie when it provably belongs to a node instance that never served; returns ""
    then, or why the cookie stays.

    A start that failed half-way (before this order was fixed, a node that could not bind its port) leaves
    a cookie in ZooKeeper naming a directory that holds the same cookie and nothing else; a later start of
    that node id anywhere else was refused for good (issue 15 item 7). The proof that the instance never
    acknowledged an add: its directory is on this host, carries that very cookie, has no journal file, no
    snapshot and no snapshot recorded (a node opens its journal and writes a snapshot before it registers),
    the node is not registered, and no process holds the directory (its lock is held here while we look and
    delete). The delete is conditional on the cookie's version, so a cookie that changed meanwhile stays.
    The other directory is left as it is: a node started there later meets a different ZooKeeper cookie
    and is refused."""
    cookie = found.value
    other = pathlib.Path(cookie.data_dir)
    if not other.is_dir():
        return f"{other} is not on this host"
    if store.exists(layout.node_path(cookie.node_id)):
        return f"node {cookie.node_id} is registered (running)"
    try:
        lock = DataDirLock.acquire(other, cookie.node_id)
    except DataDirInUseError as exc:
        return f"{other} is in use by {exc.holder.describe()}"
    except StorageNodeError as exc:
        return f"{other} cannot be locked ({exc})"
    try:
        stamp = read_disk_cookie(other)
        if stamp is None or stamp.instance_id != cookie.instance_id:
            return f"{other} does not hold that cookie"
        if holds_data(other) or snapshot_recorded(other):
            return f"{other} holds its data"
        request = store.transaction()
        request.delete(layout.cookie_path(cookie.node_id), found.version)
        try:
            request.commit()
        except (BadVersionError, NoNodeError):
            return "its cookie changed while this node looked at it"
        return ""
    finally:
        lock.release()


def write_journal_cookie(data_dir: pathlib.Path, cookie: Cookie) -> None:
    """A first start (nothing acknowledged yet, so any leftover is replaced), or a migrated journal."""
    journal = data_dir / JOURNAL_DIR
    private_directory(journal)
    write_disk_cookie(journal, cookie)


def check_journal_cookie(data_dir: pathlib.Path, cookie: Cookie) -> None:
    """The journal directory of a node that has served before carries its cookie (module docstring)."""
    journal = data_dir / JOURNAL_DIR
    todo = _WHAT_TO_DO.format(node=cookie.node_id)
    stamp = read_disk_cookie(journal)
    if stamp is None and journal_files(data_dir):
        write_journal_cookie(data_dir, cookie)      # written before journal cookies existed
        return
    if stamp is None:
        state = "is missing" if not journal.exists() else "has no cookie and no journal file"
        raise CookieMismatchError(
            f"journal directory {journal} {state}, but node {cookie.node_id} has served from {data_dir} "
            f"before (its cookie is there and in ZooKeeper): the journal was deleted or emptied, or its volume "
            f"is not mounted, and replaying it would deny entries this node acknowledged; mount or restore "
            f"{journal}, or {todo}"
        )
    if (stamp.node_id, stamp.instance_id) != (cookie.node_id, cookie.instance_id):
        raise CookieMismatchError(
            f"journal directory {journal} holds the cookie of node {stamp.node_id} instance {stamp.instance_id}, "
            f"but {data_dir} is node {cookie.node_id} instance {cookie.instance_id}: the journal belongs to "
            f"another node or an earlier incarnation of this one (a volume mounted in the wrong place?); "
            f"mount the node's own journal at {journal}, or {todo}"
        )


def check_snapshot(data_dir: pathlib.Path, cookie: Cookie) -> None:
    """A snapshot the cookie records is still there, and so is the journal it covers."""
    if not snapshot_recorded(data_dir):
        return
    todo = _WHAT_TO_DO.format(node=cookie.node_id)
    snapshot = data_dir / SNAPSHOT_NAME
    if not snapshot.exists():
        raise CookieMismatchError(
            f"the checkpoint snapshot {snapshot} is missing, but the cookie of node {cookie.node_id} records "
            f"that one was written (a snapshot is replaced, never removed): it was deleted, and starting "
            f"without it could forget acknowledged entries; restore {snapshot}, or {todo}"
        )
    if not journal_files(data_dir):
        raise CookieMismatchError(
            f"journal directory {data_dir / JOURNAL_DIR} has its cookie but no journal file, although node "
            f"{cookie.node_id} has written its journal before (its snapshot is recorded): the journal files "
            f"were deleted; restore them, or {todo}"
        )
