"""The cookie: a node's identity, kept in ZooKeeper and in its data directory (rule 8).

A node whose directory was wiped, swapped with another node's, or pointed at another cluster would
answer "no such entry" for entries it acknowledged before; so it refuses to start instead. The fix
is never to delete the cookie: decommission the node and start a fresh one under a new id.
"""
from __future__ import annotations

import json
import os
import pathlib
import time
import uuid

from metadata import registry
from metadata.model import Cookie
from metadata.store import MetadataStore
from storage_node.checkpoint import SNAPSHOT_NAME
from storage_node.errors import CookieMismatchError
from storage_node.journal import JOURNAL_DIR, fsync_directory

COOKIE_NAME = "COOKIE"
_WHAT_TO_DO = ("restore the node's original data directory, or decommission node {node} (re-replicate its "
               "ledgers) and start an empty directory under a new node id; never delete the cookie")


def read_disk_cookie(data_dir: pathlib.Path) -> Cookie | None:
    path = data_dir / COOKIE_NAME
    try:
        fields = json.loads(path.read_text())
        return Cookie(fields["node_id"], fields["instance_id"], fields["data_dir"], fields["created_at"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise CookieMismatchError(
            f"the cookie file {path} is damaged ({exc}): the node cannot tell whose data this is; "
            + _WHAT_TO_DO.format(node="<its id>")
        ) from exc


def write_disk_cookie(data_dir: pathlib.Path, cookie: Cookie) -> None:
    tmp = data_dir / (COOKIE_NAME + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"node_id": cookie.node_id, "instance_id": cookie.instance_id,
                   "data_dir": cookie.data_dir, "created_at": cookie.created_at}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, data_dir / COOKIE_NAME)
    fsync_directory(data_dir)


def holds_data(data_dir: pathlib.Path) -> bool:
    """Whether the directory has a journal segment or snapshot (the node ran here before)."""
    journal = data_dir / JOURNAL_DIR
    return (data_dir / SNAPSHOT_NAME).exists() or (journal.exists() and any(journal.iterdir()))


def check_cookie(store: MetadataStore, data_dir: pathlib.Path, node_id: str) -> Cookie:
    """The node's cookie once disk and ZooKeeper agree; creates both for a brand-new node."""
    data_dir.mkdir(parents=True, exist_ok=True)
    disk = read_disk_cookie(data_dir)
    found = registry.read_cookie(store, node_id)
    zk = found.value if found is not None else None
    todo = _WHAT_TO_DO.format(node=node_id)
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
        registry.create_cookie(store, disk)
        return disk
    if disk is None:
        if holds_data(data_dir):
            raise CookieMismatchError(
                f"data directory {data_dir} holds journal data but no cookie, and ZooKeeper has none for node "
                f"{node_id}: the node cannot tell whose data this is; use an empty directory for a new node"
            )
        disk = Cookie(node_id, uuid.uuid4().hex, str(data_dir), time.time())
        write_disk_cookie(data_dir, disk)
        registry.create_cookie(store, disk)
    return disk
