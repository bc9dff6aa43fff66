"""The benchmarks' CPU accounting (connector/bench/cpu.py) on real processes: a stand-in for Spark's JVM that reaps
a worker of its own and starts a daemon, which forks workers and reaps them as pyspark.daemon does and starts one
that leaves the JVM's tree (as the driver keeper does), and stand-ins for a storage node and ZooKeeper."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from connector.bench.cpu import CpuSplit, SparkCpu
from tests.harness.poll import poll_until

BURN = textwrap.dedent("""
    import os, time
    def burn(seconds):
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass
    def burnt_in_child(seconds):
        child = os.fork()
        if child == 0:
            burn(seconds)
            os._exit(0)
        os.waitpid(child, 0)
""")
# Burns, says so, then waits for its stdin to end.
IDLE_AFTER = BURN + "import sys\nburn(float(sys.argv[1]))\nprint('burnt', flush=True)\nsys.stdin.read()\n"

# The JVM's stand-in: forks a worker that burns 0.3 s and reaps it (the JVM's own children times), then starts the
# daemon (handing on the gate's descriptor, argv[2]) and waits for their shared stdin to end.
JVM = BURN + textwrap.dedent("""
    import subprocess, sys
    burnt_in_child(0.3)
    daemon = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], pass_fds=(int(sys.argv[2]),))
    sys.stdin.read()
    daemon.wait()
""")
# The daemon: forks a worker that burns 0.3 s and ends (reaped: the daemon's children times); forks one that starts
# a process in a session of its own that burns 0.15 s, says so once that process has burnt it, and ends when the
# gate (the read end of a pipe, descriptor argv[1]) closes, so that process leaves the tree (the keeper's way);
# forks one that burns 0.2 s and stays (a live descendant), which says so; at the end of stdin it ends that one.
DAEMON = BURN + textwrap.dedent("""
    import subprocess, sys
    burnt_in_child(0.3)
    starter = os.fork()
    if starter == 0:
        stray = subprocess.Popen([sys.executable, "-c", STRAY_CODE, "0.15"], start_new_session=True,
                                 stdout=subprocess.PIPE, text=True)
        stray.stdout.readline()   # it has burnt
        print("started", stray.pid, flush=True)
        os.read(int(sys.argv[1]), 1)   # returns at the end of the pipe: the test closed its end
        os._exit(0)
    os.waitpid(starter, 0)
    staying = os.fork()
    if staying == 0:
        burn(0.2)
        print("burnt", flush=True)
        sys.stdin.read()
        os._exit(0)
    sys.stdin.read()
    os.waitpid(staying, 0)
""")


def _line(process: subprocess.Popen, timeout: float) -> str:
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    return process.stdout.readline() if ready else ""


@pytest.fixture
def processes():
    """The processes a test starts, each in a session of its own, killed with whatever they started at its end."""
    started: list = []
    yield started
    for process in started:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if isinstance(process, subprocess.Popen):
            process.wait(timeout=30)


def test_the_split_counts_the_jvm_its_workers_ended_live_and_gone_from_the_tree_the_nodes_and_zookeeper(processes):
    node, zookeeper = (subprocess.Popen([sys.executable, "-c", IDLE_AFTER, str(burn)], stdin=subprocess.PIPE,
                                        stdout=subprocess.DEVNULL, start_new_session=True) for burn in (0.25, 0.1))
    processes += [node, zookeeper]
    gate, opener = os.pipe()   # the starter ends when the test closes `opener`
    try:
        jvm = subprocess.Popen([sys.executable, "-c", JVM, DAEMON.replace("STRAY_CODE", repr(IDLE_AFTER)), str(gate)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
                               pass_fds=(gate,))
    finally:
        os.close(gate)
    processes.append(jvm)
    cpu = SparkCpu(jvm.pid, [node.pid], zookeeper.pid)   # every process is new: all their CPU is counted

    started, stray = _line(jvm, 60).split()
    assert started == "started"
    processes.append(psutil.Process(int(stray)))
    cpu.read()   # the process the starter started is seen below the JVM
    os.close(opener)
    assert _line(jvm, 60) == "burnt\n"
    poll_until(lambda: cpu.read().nodes >= 0.23 and cpu.read().zookeeper >= 0.09, timeout=30,
               what="the node's and ZooKeeper's stand-ins burnt their CPU")
    split = cpu.read()

    # 0.3 s reaped by the JVM, 0.3 s reaped by the daemon, 0.2 s live, 0.15 s gone from the tree: 0.95 s and the
    # starts of the daemon and of the process that left, less what the kernel's clock ticks truncate (up to 0.02 s
    # a process). Leaving any of the four out, or counting one of the largest twice, falls outside.
    assert 0.88 <= split.workers <= 1.15
    assert 0.23 <= split.nodes <= 0.45
    assert 0.09 <= split.zookeeper <= 0.3
    assert split.jvm <= 0.3   # the stand-in's own start: its workers' CPU is not the JVM's
    assert split.total == pytest.approx(split.jvm + split.workers + split.nodes + split.zookeeper)


def test_a_difference_is_taken_part_by_part_and_described_with_the_cores_busy():
    later, earlier = CpuSplit(3.0, 1.0, 2.0, 0.5), CpuSplit(1.0, 0.5, 0.5, 0.0)
    assert later - earlier == CpuSplit(2.0, 0.5, 1.5, 0.5)
    assert (later - earlier).describe(2.0).startswith(
        "JVM 2.00 + Python workers 0.50 + nodes 1.50 + ZooKeeper 0.50 = 4.50 CPU s, 2.25 of ")
