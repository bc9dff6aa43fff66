"""Who may read a node's files: the node's own user, nobody else.

The journal holds every ledger's master key and every payload; the snapshot, its deltas and the compacted
files hold the same. So every file the node writes is created FILE_MODE and every directory DIRECTORY_MODE,
whatever the umask (a umask only ever takes bits away). A data or journal directory that is open to others
already (made by an operator, or by a node before this rule) is closed on start, which also shuts others out
of the files an older node created 0644 in it; a mode is only ever narrowed, never widened.
"""
from __future__ import annotations

import logging
import os
import pathlib
import stat

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700
_OTHERS = stat.S_IRWXG | stat.S_IRWXO

_log = logging.getLogger(__name__)


def new_file(path: str, flags: int) -> int:
    """open()'s opener for a file the node writes."""
    return os.open(path, flags, FILE_MODE)


def private_directory(path: pathlib.Path) -> None:
    """Create path (its missing parents with the umask's modes, as `mkdir -p` does) readable by this user only,
    or take the group's and others' permissions from it if it exists. One this user cannot change (another
    user owns it) is used as it is, with a warning: refusing to start over it would help nobody."""
    path.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & _OTHERS:
        try:
            os.chmod(path, mode & ~_OTHERS)
        except PermissionError as exc:
            _log.warning("directory %s is open to other users (mode %o) and this user cannot change that (%s): "
                         "`chmod go= %s` as its owner keeps the node's data private", path, mode, exc.strerror, path)
