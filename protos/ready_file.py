"""The ready file: how a storage node started with `--ready-file PATH` tells whoever started it that it serves.

The node (storage_node/node.py) writes it once it is registered, at the moment it logs "serving on", and
removes it when it stops; a launcher (connector/node_launcher.py) waits for it instead of reading the node's
log. It is the one format both sides of that process boundary agree on, kept here as protos/auth.py keeps the
token's metadata key: the connector never imports the node. A small JSON object, written to PATH.tmp and
renamed onto PATH, so a reader sees the whole file or none:

    {"node_id": "node-1", "address": "127.0.0.1:41234", "metrics_address": "127.0.0.1:41235", "pid": 4242}

PATH is on the node's command line, for every local user to see, and often in a shared temporary directory: a
user who plants a symlink at PATH.tmp must not make the node overwrite what it points to (the file is created
new, never through a link), and one who plants a ready file of their own at PATH must not make a launcher
believe a node serves at their address (a reader takes only a file of its own user).
"""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import pathlib


@dataclasses.dataclass(frozen=True)
class NodeReady:
    node_id: str
    address: str            # host:port of the gRPC service, as registered in ZooKeeper
    metrics_address: str    # host:port of the Prometheus endpoint
    pid: int

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    @property
    def metrics_port(self) -> int:
        return int(self.metrics_address.rsplit(":", 1)[1])


def write_ready(path: str | os.PathLike, ready: NodeReady) -> None:
    """Atomically: a reader never sees half a file."""
    path = pathlib.Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)    # one an earlier node left
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with open(fd, "w") as file:
        file.write(json.dumps(dataclasses.asdict(ready)) + "\n")
    os.replace(tmp, path)


def read_ready(path: str | os.PathLike) -> NodeReady | None:
    """The node's ready file, or None while there is none. Keys this version does not know are ignored."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        why = "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise ValueError(f"{path} is not a storage node's ready file ({why}): remove it") from None
    with open(fd) as file:
        owner = os.fstat(fd).st_uid
        if owner != os.geteuid():
            raise ValueError(f"{path} is not a storage node's ready file: user {owner} wrote it, not this user "
                             f"({os.geteuid()}); remove it, or give --ready-file a path in a directory of your own")
        try:
            raw = json.loads(file.read())
        except ValueError as exc:
            raise ValueError(f"{path} is not a storage node's ready file: {exc}") from None
    try:
        return NodeReady(str(raw["node_id"]), str(raw["address"]), str(raw["metrics_address"]), int(raw["pid"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path} is not a storage node's ready file (missing or bad {exc})") from None


def remove_ready(path: str | os.PathLike) -> None:
    pathlib.Path(path).unlink(missing_ok=True)
