"""`ledger bench spark`'s CPU split (connector/bench/spark_cpu.py) on real processes: a stand-in for Spark's JVM
that starts a daemon, which forks workers and reaps them as pyspark.daemon does, and a stand-in for a storage node."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import psutil

from connector.bench.spark_cpu import CpuSplit, SparkCpu
from tests.harness.poll import poll_until

NODE = "import time\nend = time.process_time() + 0.25\nwhile time.process_time() < end: pass\ntime.sleep(600)\n"

# The JVM's stand-in: starts a daemon and waits on stdin. The daemon forks a worker that burns CPU and ends (reaped:
# in the daemon's children times), then forks one that burns CPU and stays (a live descendant), says so, and at the
# end of its stdin (shared with the JVM's) ends that worker and itself.
JVM = textwrap.dedent("""
    import subprocess, sys
    daemon = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=sys.stdout)
    sys.stdin.read()
    daemon.wait()
""")
DAEMON = textwrap.dedent("""
    import os, sys, time
    def burn(seconds):
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass
    ended = os.fork()
    if ended == 0:
        burn(0.3)
        os._exit(0)
    os.waitpid(ended, 0)
    staying = os.fork()
    if staying == 0:
        burn(0.2)
        print("burnt", flush=True)
        time.sleep(600)
        os._exit(0)
    sys.stdin.read()
    os.kill(staying, 9)
    os.waitpid(staying, 0)
""")


def test_the_split_counts_the_jvms_own_cpu_its_live_and_ended_workers_and_the_nodes():
    node = subprocess.Popen([sys.executable, "-c", NODE])
    jvm = subprocess.Popen([sys.executable, "-c", JVM, DAEMON], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True)
    try:
        cpu = SparkCpu(jvm.pid, [node.pid])
        assert jvm.stdout.readline() == "burnt\n"
        poll_until(lambda: sum(psutil.Process(node.pid).cpu_times()[:2]) >= 0.2, timeout=30,
                   what="the node's stand-in burnt its CPU")
        split = cpu.read()

        assert split.workers >= 0.45   # 0.3 s of the ended worker, 0.2 s of the live one (the daemon's own: small)
        assert split.nodes >= 0.2
        assert split.jvm < 0.3          # the stand-in's own start only: its workers' CPU is not the JVM's
        assert (split - CpuSplit(split.jvm, 0.4, 0.1)).workers == split.workers - 0.4
    finally:
        jvm.stdin.close()
        jvm.wait(timeout=30)
        node.kill()
        node.wait(timeout=30)


def test_describe_names_each_part_and_the_cores_busy():
    assert CpuSplit(2.0, 0.5, 1.5).describe(2.0).startswith(
        "JVM 2.00 + Python workers 0.50 + nodes 1.50 = 4.00 CPU s, 2.00 of ")
