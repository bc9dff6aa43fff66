"""CPU seconds (user + system) of the processes a benchmark measures, read from the kernel through psutil.

CpuClock: the storage nodes and the benchmark's own process (`ledger bench node`, `ledger bench client`).

SparkCpu: where a local Spark application's CPU goes, for `ledger bench spark`, which reads it around every run it
times, so a case that misses its target shows whether the run was bound by CPU (the cores busy over its wall time)
and whose CPU it was, measured in the same run as the ratio. Spark starts its Python workers as children of the JVM
(a daemon per kind of worker, which forks the workers and reaps them); a worker may start more (the connector's
driver keeper). The Python workers' CPU is that of every process seen below the JVM and still running (also one
that has left the JVM's tree since, as the keeper does when the worker that started it ends), plus what the kernel
added to a parent's children times when it reaped one that ended. A process that ends while they are read can be
missed or counted twice, and one reaped outside the tree takes its CPU along: a warm run starts and ends few (Spark
keeps its workers for the next task; a planning call may get a fresh one), so the figures are those of their work.
"""
from __future__ import annotations

import dataclasses
import os
import resource

import psutil


def seconds(process: psutil.Process, reaped: bool = False) -> float:
    """The process's CPU seconds; with reaped, also those of the children it has reaped (and theirs)."""
    times = process.cpu_times()
    return times.user + times.system + (times.children_user + times.children_system if reaped else 0.0)


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


class CpuClock:
    """CPU seconds used so far by the storage node processes and by this process."""

    def __init__(self, node_pids: list[int]):
        self._nodes = [psutil.Process(pid) for pid in node_pids]

    def read(self) -> tuple[float, float]:
        own = resource.getrusage(resource.RUSAGE_SELF)
        return sum(seconds(node) for node in self._nodes), own.ru_utime + own.ru_stime


@dataclasses.dataclass(frozen=True)
class CpuSplit:
    """CPU seconds, by where they were spent."""

    jvm: float = 0.0
    workers: float = 0.0
    nodes: float = 0.0
    zookeeper: float = 0.0

    @property
    def total(self) -> float:
        return self.jvm + self.workers + self.nodes + self.zookeeper

    def __sub__(self, other: "CpuSplit") -> "CpuSplit":
        return CpuSplit(self.jvm - other.jvm, self.workers - other.workers, self.nodes - other.nodes,
                        self.zookeeper - other.zookeeper)

    def describe(self, wall: float) -> str:
        """'JVM a + Python workers b + nodes c + ZooKeeper d = t CPU s, n of N cores' over `wall` seconds."""
        return (f"JVM {self.jvm:.2f} + Python workers {self.workers:.2f} + nodes {self.nodes:.2f} + ZooKeeper "
                f"{self.zookeeper:.2f} = {self.total:.2f} CPU s, {self.total / max(wall, 1e-9):.2f} of "
                f"{usable_cores()} cores")


class SparkCpu:
    """CPU seconds used so far by a local Spark application, the storage nodes and ZooKeeper beside it."""

    def __init__(self, jvm_pid: int, node_pids: list[int], zookeeper_pid: int | None = None):
        self._jvm = psutil.Process(jvm_pid)
        self._nodes = [psutil.Process(pid) for pid in node_pids]
        self._zookeeper = psutil.Process(zookeeper_pid) if zookeeper_pid else None
        self._seen: dict[int, psutil.Process] = {}   # every process seen below the JVM, by pid

    @classmethod
    def of(cls, spark, node_pids: list[int], zookeeper_pid: int | None = None) -> "SparkCpu":
        """For the JVM of a local SparkSession (its driver runs every task: local[N])."""
        return cls(int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()), node_pids, zookeeper_pid)

    def read(self) -> CpuSplit:
        for child in self._jvm.children(recursive=True):
            self._seen.setdefault(child.pid, child)
        workers = 0.0
        for pid, process in list(self._seen.items()):
            try:
                if not process.is_running():   # ended, or its pid taken by another process (is_running checks)
                    raise psutil.NoSuchProcess(pid)
                workers += seconds(process, reaped=True)
            except psutil.NoSuchProcess:
                del self._seen[pid]
        jvm = self._jvm.cpu_times()
        return CpuSplit(jvm.user + jvm.system, workers + jvm.children_user + jvm.children_system,
                        sum(seconds(node) for node in self._nodes),
                        seconds(self._zookeeper) if self._zookeeper is not None else 0.0)
