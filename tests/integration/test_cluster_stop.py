"""LocalCluster.stop is bounded by its timeout in all: nodes that do not stop on SIGTERM are killed once
one deadline passed, not after a full timeout each (five stuck nodes used to take five timeouts)."""
from __future__ import annotations

import os
import signal
import time

from connector.cluster import LocalCluster, pid_alive


def test_nodes_that_ignore_sigterm_are_killed_after_one_timeout_not_one_each(tmp_path):
    cluster = LocalCluster(tmp_path / "cluster", nodes=3)
    cluster.start()
    pids = [spec.pid for spec in cluster.state.nodes]
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)  # a node that does not react to SIGTERM
        started = time.monotonic()
        cluster.stop(timeout=4)
        assert time.monotonic() - started < 8  # one deadline of 4 s, then SIGKILL (not 3 x 4 s)
        assert not any(pid_alive(pid) for pid in pids)
    finally:
        for pid in pids:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
