"""The node ceiling (connector/bench/node_ceiling.py), the yardstick of `ledger bench node` and `ledger bench client`,
on real server processes: it makes what it receives durable and answers, leaves no file behind, and a server that
dies mid-run ends the benchmark with a message instead of a hang or a traceback."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from connector.bench.node_ceiling import CeilingServer, SyncedFile, measure
from tests.harness.poll import poll_until


@pytest.fixture
def servers(tmp_path):
    started: list[CeilingServer] = []

    def start(n: int) -> list[CeilingServer]:
        started.extend(CeilingServer(tmp_path / f"ceiling-{len(started) + i}") for i in range(n))
        return started[-n:]

    yield start
    for server in started:
        server.stop()


def _stream_files(tmp_path) -> list:
    return sorted(tmp_path.glob("ceiling-*/stream-*.dat"))


def test_one_server_and_three_acknowledge_entries_and_remove_each_streams_file(servers, tmp_path):
    one = servers(1)
    single = measure(one, 1, 1024, 16, 256, 0.05, 0.3)
    three = measure(one + servers(2), 2, 64 * 1024, 1, 8, 0.05, 0.3)
    for run in (single, three):
        assert run.entries_per_s > 0 and run.server_cores > 0 and run.driver_cores > 0
    poll_until(lambda: not _stream_files(tmp_path), timeout=10, what="each stream's file removed when it ended")


def test_a_server_killed_mid_run_ends_the_measurement_with_a_message(servers, tmp_path):
    three = servers(3)
    killer = threading.Timer(0.3, os.kill, (three[1].pid, signal.SIGKILL))
    killer.start()
    try:
        with pytest.raises(SystemExit, match="node ceiling server"):
            measure(three, 2, 64 * 1024, 1, 8, 0.05, 30.0)
    finally:
        killer.cancel()


def test_a_group_of_more_buffers_than_one_write_takes_is_written_whole(tmp_path):
    buffers = [bytes([n % 256]) * 3 for n in range(os.sysconf("SC_IOV_MAX") + 5)]
    synced = SyncedFile(tmp_path / "group.dat")
    synced.write_group(buffers)
    assert (tmp_path / "group.dat").read_bytes() == b"".join(buffers)
    synced.remove()
    assert not (tmp_path / "group.dat").exists()
