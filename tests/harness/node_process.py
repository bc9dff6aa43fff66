"""A storage node as a real process on loopback, with real faults: SIGKILL, SIGSTOP/SIGCONT, restart."""
from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import threading

from tests.harness.poll import poll_until

_SERVING = re.compile(r"serving on (\S+:\d+)")


class NodeProcess:
    """`python -m storage_node` with its own data directory; port 0 unless given."""

    def __init__(self, metadata_uri: str, data_dir: pathlib.Path, node_id: str, *extra_args: str, port: int = 0):
        self.metadata_uri = metadata_uri
        self.data_dir = pathlib.Path(data_dir)
        self.node_id = node_id
        self.extra_args = list(extra_args)
        self.port = port
        self.process: subprocess.Popen | None = None
        self.address: str | None = None
        self.output: list[str] = []

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "storage_node",
            "--data-dir", str(self.data_dir),
            "--port", str(self.port),
            "--metadata", self.metadata_uri,
            "--node-id", self.node_id,
            *self.extra_args,
        ]

    def start(self, timeout: float = 30.0, expect_failure: bool = False) -> "NodeProcess":
        self.output = []
        self.address = None
        self.process = subprocess.Popen(
            self.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
        )
        threading.Thread(target=self._pump, args=(self.process,), daemon=True).start()
        if expect_failure:
            poll_until(lambda: self.process.poll() is not None, timeout, what=f"node {self.node_id} to exit")
            return self
        poll_until(
            lambda: self.address or self._exited(), timeout, what=f"node {self.node_id} to serve"
        )
        if self.address is None:
            raise AssertionError(f"node {self.node_id} exited: {self.log()}")
        # Keep the port for restarts so that a restarted node has the same address.
        self.port = int(self.address.rsplit(":", 1)[1])
        return self

    def _exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def _pump(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self.output.append(line)
            match = _SERVING.search(line)
            if match and self.address is None:
                self.address = match.group(1)

    def log(self) -> str:
        return "".join(self.output)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> None:
        """Crash: SIGKILL, no chance to flush anything."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)

    def stop(self, timeout: float = 20.0) -> int:
        """Clean shutdown (SIGTERM); returns the exit code."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode if self.process else 0

    def pause(self) -> None:
        """A long GC pause: SIGSTOP."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def restart(self, timeout: float = 30.0) -> "NodeProcess":
        self.kill()
        return self.start(timeout)
