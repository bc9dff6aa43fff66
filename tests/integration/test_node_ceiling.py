"""The node ceiling (connector/bench/node_ceiling.py), the yardstick of `ledger bench node` and `ledger bench client`,
on real server processes: it makes what it receives durable and answers, leaves no file behind, and a server that
dies mid-run ends the benchmark with a message instead of a hang or a traceback."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from connector.bench.node_ceiling import CeilingServer, SyncedFile, measure, verdict
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


def test_a_stopped_server_holds_up_no_other_when_two_of_three_acknowledge(servers):
    three = servers(3)
    os.kill(three[2].pid, signal.SIGSTOP)    # for the whole measured time: the writer's senders are per node too
    waker = threading.Timer(2.0, os.kill, (three[2].pid, signal.SIGCONT))
    waker.start()
    try:
        run = measure(three, 2, 1024 * 1024, 1, 8, 0.5, 1.0)
    finally:
        waker.cancel()
        os.kill(three[2].pid, signal.SIGCONT)
    assert run.entries_per_s > 0


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


def test_an_ack_quorum_larger_than_the_servers_is_refused_with_a_message(servers):
    with pytest.raises(ValueError, match="ack quorum 2 must be between 1 and the number of servers, 1"):
        measure(servers(1), 2, 1024, 1, 8, 0.05, 0.1)


def test_the_server_started_without_a_directory_says_how_to_start_it():
    done = subprocess.run([sys.executable, "-m", "connector.bench.node_ceiling"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "usage:" in done.stderr and "Traceback" not in done.stderr


def test_a_target_the_ceiling_misses_too_is_bound_and_one_it_reaches_is_only_missed():
    assert verdict(0.9, 0.8, 0.7, "reaches 0.70") == "met"
    assert verdict(0.7, 0.8, 0.75, "reaches 0.75") == "MISSED, bound on this machine: the ceiling reaches 0.75"
    assert verdict(0.7, 0.8, 0.85, "reaches 0.85") == "MISSED"
    assert verdict(0.7, 0.8) == "MISSED"


def test_the_replicated_ceiling_counts_an_entry_once_two_of_three_servers_made_it_durable(servers):
    """`ledger bench spark`'s replicated ceiling (connector/bench/replicated_ceiling.py): its writer's sends, with one
    of three servers stopped, complete on the other two; its count is the second-highest server's."""
    from connector.bench.replicated_ceiling import WINDOW, _Replicas

    three = servers(3)
    os.kill(three[2].pid, signal.SIGSTOP)
    replicas = _Replicas([server.address for server in three], ack_quorum=2)
    try:
        for sent in range(1, 3 * WINDOW + 1):
            replicas.wait_until(lambda: sent - 1 - replicas.acked() < WINDOW)
            replicas.send(b"x" * 4096)
        replicas.wait_until(lambda: replicas.acked() >= 3 * WINDOW)
        assert sorted(replicas.durable)[:1] == [0] and replicas.acked() == 3 * WINDOW
    finally:
        os.kill(three[2].pid, signal.SIGCONT)
        replicas.close()
    assert replicas.durable == [3 * WINDOW] * 3   # the third caught up once it ran again
