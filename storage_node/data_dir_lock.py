"""One node process per data directory: an OS lock on DATA_DIR/LOCK, held for the process's life.

Two processes on one directory would both append to the journal and both claim the node's registration; the
second one's exit used to remove the first one's registration (issue 15 item 7). `flock` is the process's,
not the file's: the kernel drops it when the process ends however it ends (SIGKILL included), so a LOCK file
left behind never keeps a directory locked, and a paused (SIGSTOPped) node keeps its directory. The file is
never removed (removing it would let a third process lock a new file while the second still holds the old).

The holder writes its pid, node id and address into the file so that a refused process can name it; those
notes are information for the operator, the lock itself is what decides.
"""
from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import pathlib
import time

from storage_node.errors import StorageNodeError
from storage_node.file_modes import FILE_MODE, private_directory

LOCK_NAME = "LOCK"


@dataclasses.dataclass(frozen=True)
class Holder:
    """What the lock holder wrote about itself (any field may be missing: it writes right after locking)."""

    pid: int = 0
    node_id: str = ""
    address: str = ""
    since: float = 0.0

    def describe(self) -> str:
        if not self.pid:
            return "another process (it has not written its pid into the lock file yet)"
        details = [f"pid {self.pid}", f"listening on {self.address}" if self.address else "starting"]
        if self.since:
            details.append(time.strftime("since %Y-%m-%d %H:%M:%S", time.localtime(self.since)))
        who = f"storage node {self.node_id}" if self.node_id else "process"
        return f"{who} ({', '.join(details)})"


class DataDirInUseError(StorageNodeError):
    """Another process holds the data directory's lock: refuse to start."""

    def __init__(self, message: str, holder: Holder):
        super().__init__(message)
        self.holder = holder


class DataDirLock:
    """The lock of one data directory, held by this process until release()."""

    def __init__(self, path: pathlib.Path, fd: int):
        self.path = path
        self._fd = fd
        self._holder = Holder(pid=os.getpid(), since=time.time())

    @classmethod
    def acquire(cls, data_dir: pathlib.Path, node_id: str = "") -> "DataDirLock":
        """Lock data_dir (created if missing) or raise DataDirInUseError naming the process that holds it."""
        path = data_dir / LOCK_NAME
        try:
            private_directory(data_dir)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        except OSError as exc:
            raise StorageNodeError(f"cannot open the lock file {path} ({exc}): check that the data directory "
                                   f"exists and this user may write it") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_holder(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise StorageNodeError(f"cannot lock data directory {data_dir} ({path}: {exc})") from exc
            raise DataDirInUseError(
                f"data directory {data_dir} is in use by {holder.describe()}: one data directory serves one node "
                f"process; stop that one first{_stop_hint(holder)}, or give this node its own --data-dir",
                holder,
            ) from None
        lock = cls(path, fd)
        lock.record(node_id=node_id)
        return lock

    def record(self, **notes) -> None:
        """Update the notes in the lock file (node_id, address) for whoever is refused next. Best effort: a
        full disk must not stop a node from starting (read-only, rule 9) for want of a note."""
        self._holder = dataclasses.replace(self._holder, **notes)
        data = json.dumps(dataclasses.asdict(self._holder)).encode()
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, data, 0)
        except OSError:
            pass

    def release(self) -> None:
        """Drop the lock (closing the descriptor releases it); the file stays (module docstring)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _read_holder(fd: int) -> Holder:
    try:
        fields = json.loads(os.pread(fd, 4096, 0) or b"{}")
        known = {f.name for f in dataclasses.fields(Holder)}
        return Holder(**{k: v for k, v in fields.items() if k in known})
    except (OSError, ValueError, TypeError):
        return Holder()


def _stop_hint(holder: Holder) -> str:
    return f" (`kill -TERM {holder.pid}` stops it cleanly)" if holder.pid else ""
