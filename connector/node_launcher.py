"""Start a storage node as its own process and wait until it serves: the one way the local cluster, the
benchmarks and the tests' harness start nodes.

The connector never imports the node (DESIGN section 2): it runs `python -m storage_node ...` (or a command
that becomes it, such as `ledger node ...`) with `--ready-file PATH` added, and waits for the file the node
writes once it is registered (protos/ready_file.py), never for a line of its log. A node that exits first,
or is not ready by the deadline, fails the wait with a NodeStartError that quotes the node's own output.

The node's output (stdout and stderr together) goes either to a log file the caller names (appended to; the
local cluster keeps one per node) or through a pipe into memory (handle.output()).
"""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Sequence

from metadata.embedded import command_line
from metadata.errors import LedgerError
from protos.ready_file import NodeReady, read_ready, remove_ready

POLL_SECONDS = 0.05
REFUSAL = "refuses to start"        # what a node says on its way out (storage_node/__main__.py)
PORT_TAKEN = "another process uses the port"   # its refusal when its port was taken (storage_node/server.py)
NODE_MODULE = "storage_node"   # `python -m storage_node`: what node_command() runs, and `ledger node` execs


class NodeStartError(LedgerError):
    """A storage node exited before it served, or did not serve by the deadline."""


def node_command(data_dir: str | os.PathLike, port: int, metadata: str, node_id: str,
                 *extra_args: str) -> list[str]:
    """The command line of `python -m storage_node` (with this interpreter) for one node."""
    return [sys.executable, "-m", NODE_MODULE, "--data-dir", str(data_dir), "--port", str(port),
            "--metadata", metadata, "--node-id", node_id, *extra_args]


def pid_alive(pid: int) -> bool:
    """Whether process pid runs (a zombie, dead but not yet reaped, does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


def runs_node(pid: int, data_dir: str | os.PathLike) -> bool:
    """Whether process pid is a storage node of data_dir (`python -m storage_node --data-dir DATA_DIR ...`, as
    node_command() and `ledger node` run it). pid_alive says whether some process has the pid; a pid recorded
    before a reboot (the local cluster's cluster.json) may be any other process's now, and must not be signalled
    nor counted as the node."""
    argv = command_line(pid)
    data = _option(argv, "--data-dir")
    return _option(argv, "-m") == NODE_MODULE and data is not None and \
        os.path.realpath(data) == os.path.realpath(data_dir)


def _option(argv: Sequence[str], name: str) -> str | None:
    """The value of option name in argv (`name VALUE` or `name=VALUE`), None without it."""
    for word, after in zip(argv, [*argv[1:], None]):
        if word == name:
            return after
        if word.startswith(name + "="):
            return word[len(name) + 1:]
    return None


class NodeHandle:
    """One storage node process: wait_ready(), then address, pid, output(), stop(), kill()."""

    def __init__(self, node_id: str, ready_file: pathlib.Path, *, process: subprocess.Popen | None = None,
                 pid: int = 0, log_file: pathlib.Path | None = None, log_start: int = 0,
                 own_ready_file: bool = False):
        self.node_id = node_id
        self.ready_file = ready_file
        self.process = process
        self._pid = process.pid if process is not None else pid
        self.log_file = log_file
        self._log_start = log_start
        self._own_ready_file = own_ready_file
        self._lines: list[str] = []
        self._pump: threading.Thread | None = None
        self.ready: NodeReady | None = None
        if process is not None and process.stdout is not None:
            self._pump = threading.Thread(target=self._read_output, name=f"output of {node_id}", daemon=True)
            self._pump.start()

    @classmethod
    def attach(cls, node_id: str, pid: int, ready_file: pathlib.Path,
               log_file: pathlib.Path | None = None) -> "NodeHandle":
        """A node process started earlier (by another process, say an earlier `ledger cluster start`)."""
        return cls(node_id, pathlib.Path(ready_file), pid=pid, log_file=log_file)

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def address(self) -> str:
        if self.ready is None:
            raise NodeStartError(f"storage node {self.node_id} has not said it serves (wait_ready first)")
        return self.ready.address

    # -- readiness -----------------------------------------------------------------------------

    def exit_status(self) -> int | None:
        """The exit status once the process is gone (-1 if unknown: not our child), None while it runs."""
        if self.process is not None:
            return self.process.poll()
        return None if pid_alive(self._pid) else -1

    def check_ready(self) -> NodeReady | None:
        """The node's ready file, once this process wrote it (not a stale one of an earlier process)."""
        if self.ready is None:
            ready = read_ready(self.ready_file)
            if ready is not None and ready.pid == self._pid:
                self.ready = ready
        return self.ready

    def wait_ready(self, timeout: float) -> NodeReady:
        return wait_all_ready([self], timeout)[0]

    # -- output --------------------------------------------------------------------------------

    def _read_output(self) -> None:
        for line in self.process.stdout:
            self._lines.append(line)

    def output(self) -> str:
        """What the node wrote since this start (all of it once it exited)."""
        if self.log_file is not None:
            try:
                with open(self.log_file, "rb") as log:
                    log.seek(self._log_start)
                    return log.read().decode(errors="replace")
            except OSError:
                return ""
        if self._pump is not None and self.exit_status() is not None:
            self._pump.join(5)      # the pipe's last lines, read after the exit
        return "".join(self._lines)

    def port_taken(self) -> bool:
        """Whether the node, having exited, refused to start because another process held its port."""
        return self.exit_status() is not None and any(
            REFUSAL in line and PORT_TAKEN in line for line in self.output().splitlines())

    def failure(self, what: str) -> str:
        """One line saying what went wrong in the node's own last word, then where to read the rest."""
        lines = [line.strip() for line in self.output().splitlines() if line.strip()]
        said = next((line for line in reversed(lines) if REFUSAL in line), lines[-1] if lines else "")
        message = f"storage node {self.node_id} {what}: {said or 'without a word'}"
        if self.log_file is not None:
            return f"{message} (log: {self.log_file})"
        return message + ("\n--- its output ---\n" + "\n".join(lines) if lines else "")

    # -- stopping ------------------------------------------------------------------------------

    def kill(self) -> None:
        """Crash: SIGKILL (after SIGCONT, should it be paused), no chance to flush anything."""
        if self.exit_status() is None:
            self._signal(signal.SIGCONT)
            self._signal(signal.SIGKILL)
            self._wait(10)
        self._forget_ready_file()

    def stop(self, timeout: float = 20.0) -> int | None:
        """Clean shutdown (SIGTERM; SIGKILL after timeout seconds); the exit status (None: not our child)."""
        if self.exit_status() is None:
            self._signal(signal.SIGCONT)
            self._signal(signal.SIGTERM)
            if not self._wait(timeout):
                self._signal(signal.SIGKILL)
                self._wait(10)
        self._forget_ready_file()
        return self.process.returncode if self.process is not None else None

    def _signal(self, sig: signal.Signals) -> None:
        try:
            os.kill(self._pid, sig)
        except ProcessLookupError:
            pass

    def _wait(self, timeout: float) -> bool:
        if self.process is not None:
            try:
                self.process.wait(timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        deadline = time.monotonic() + timeout
        while pid_alive(self._pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_SECONDS)
        return True

    def _forget_ready_file(self) -> None:
        """A killed node leaves its ready file behind; one in the launcher's temporary directory goes."""
        if self._own_ready_file:
            remove_ready(self.ready_file)


def launch(command: Sequence[str], node_id: str, *, ready_file: str | os.PathLike | None = None,
           log_file: str | os.PathLike | None = None, env: dict[str, str] | None = None,
           new_session: bool = False) -> NodeHandle:
    """Start `command` (a storage node's command line; --ready-file is added) without waiting for it.

    ready_file: where the node says it serves (default: a fresh name in the temporary directory, removed
    again once the node is stopped or killed); a file left there by an earlier process is removed first.
    log_file: append the node's output there (default: keep it in memory). new_session: the node outlives
    this process's terminal (the local cluster's nodes run on after `ledger cluster start` returns)."""
    own = ready_file is None
    ready_path = pathlib.Path(ready_file if ready_file is not None else
                              pathlib.Path(tempfile.gettempdir()) / f"ledger-node-{uuid.uuid4().hex}.ready")
    remove_ready(ready_path)
    argv = [*command, "--ready-file", str(ready_path)]
    if log_file is None:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   text=True, env=env, start_new_session=new_session)
        return NodeHandle(node_id, ready_path, process=process, own_ready_file=own)
    log_path = pathlib.Path(log_file)
    with open(log_path, "ab") as log:
        start = log.tell()
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                   start_new_session=new_session)
    return NodeHandle(node_id, ready_path, process=process, log_file=log_path, log_start=start, own_ready_file=own)


def wait_all_ready(handles: Sequence[NodeHandle], timeout: float) -> list[NodeReady]:
    """Wait until every node serves; NodeStartError (naming every node that exited, in its own words) as soon
    as one exits, or once timeout seconds passed (naming those not ready)."""
    deadline = time.monotonic() + timeout
    while True:
        waiting = [h for h in handles if h.check_ready() is None]
        if not waiting:
            return [h.ready for h in handles]
        exited = [(h, h.exit_status()) for h in waiting]
        exited = [(h, status) for h, status in exited if status is not None]
        if exited:
            raise NodeStartError("; ".join(
                h.failure("exited" if status == -1 else f"exited with status {status} before it served")
                for h, status in exited))
        if time.monotonic() >= deadline:
            raise NodeStartError("; ".join(h.failure(f"did not serve within {timeout:.0f}s (no {h.ready_file})")
                                           for h in waiting))
        time.sleep(POLL_SECONDS)


def start_node(command: Sequence[str], node_id: str, timeout: float = 60.0, **launch_args) -> NodeHandle:
    """launch() and wait until the node serves; a node that does not is killed before NodeStartError."""
    handle = launch(command, node_id, **launch_args)
    try:
        handle.wait_ready(timeout)
    except BaseException:
        handle.kill()
        raise
    return handle
