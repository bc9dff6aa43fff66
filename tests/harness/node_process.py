"""A storage node as a real process on loopback, with real faults: SIGKILL, SIGSTOP/SIGCONT, restart."""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess

from connector.node_launcher import NodeHandle, NodeStartError, launch, node_command
from tests.harness.poll import poll_until


class NodeProcess:
    """`python -m storage_node` with its own data directory; port 0 unless given. Started (and waited for) by
    connector/node_launcher.py, as the local cluster and the benchmarks start theirs."""

    def __init__(self, metadata_uri: str, data_dir: pathlib.Path, node_id: str, *extra_args: str, port: int = 0):
        self.metadata_uri = metadata_uri
        self.data_dir = pathlib.Path(data_dir)
        self.node_id = node_id
        self.extra_args = list(extra_args)
        self.port = port
        self.handle: NodeHandle | None = None
        self.address: str | None = None

    def command(self) -> list[str]:
        return node_command(self.data_dir, self.port, self.metadata_uri, self.node_id, *self.extra_args)

    @property
    def process(self) -> subprocess.Popen | None:
        return self.handle.process if self.handle is not None else None

    def start(self, timeout: float = 30.0, expect_failure: bool = False) -> "NodeProcess":
        """expect_failure: the start is to be refused (what the log says is the test's); it binds a port of its
        own, not the node's earlier one, which another process may have taken since the node was killed (the
        node binds its port before it checks its directory)."""
        self.address = None
        self.handle = launch(self._refused_start_command() if expect_failure else self.command(), self.node_id)
        if expect_failure:
            poll_until(lambda: self.process.poll() is not None, timeout, what=f"node {self.node_id} to exit")
            return self
        try:
            ready = self.handle.wait_ready(timeout)
        except NodeStartError as exc:
            raise AssertionError(str(exc)) from None
        self.address = ready.address
        # Keep the port for restarts so that a restarted node has the same address.
        self.port = ready.port
        return self

    def _refused_start_command(self) -> list[str]:
        kept, self.port = self.port, 0
        try:
            return self.command()
        finally:
            self.port = kept

    def log(self) -> str:
        return self.handle.output() if self.handle is not None else ""

    @property
    def pid(self) -> int:
        assert self.handle is not None
        return self.handle.pid

    def kill(self) -> None:
        """Crash: SIGKILL, no chance to flush anything."""
        if self.handle is not None:
            self.handle.kill()

    def stop(self, timeout: float = 20.0) -> int:
        """Clean shutdown (SIGTERM); returns the exit code."""
        return self.handle.stop(timeout) if self.handle is not None else 0

    def pause(self) -> None:
        """A long GC pause: SIGSTOP."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def restart(self, timeout: float = 30.0) -> "NodeProcess":
        self.kill()
        return self.start(timeout)
