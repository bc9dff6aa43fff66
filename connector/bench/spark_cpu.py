"""Where a local Spark application's CPU goes: its JVM, the Python workers the JVM starts, and the storage nodes.

`ledger bench spark` reads this around every run it times, so a case that misses its target shows whether the run
was bound by CPU (the cores busy over its wall time) and whose CPU it was, measured in the same run as the ratio.
Spark starts its Python workers as children of the JVM (a daemon per kind of worker, which forks the workers and
reaps them), so the workers' CPU is that of the JVM's live descendants plus what the kernel added to a parent's
children times when it reaped a descendant that ended. A worker that ends while they are read can be missed or
counted twice; Spark keeps its workers for the next task or planning call, so a warm run starts and ends none.
"""
from __future__ import annotations

import dataclasses
import os

import psutil


@dataclasses.dataclass(frozen=True)
class CpuSplit:
    """CPU seconds (user + system), by where they were spent."""

    jvm: float = 0.0
    workers: float = 0.0
    nodes: float = 0.0

    @property
    def total(self) -> float:
        return self.jvm + self.workers + self.nodes

    def __sub__(self, other: "CpuSplit") -> "CpuSplit":
        return CpuSplit(self.jvm - other.jvm, self.workers - other.workers, self.nodes - other.nodes)

    def describe(self, wall: float) -> str:
        """'JVM a + Python workers b + nodes c = t CPU s, n of N cores' over `wall` seconds."""
        return (f"JVM {self.jvm:.2f} + Python workers {self.workers:.2f} + nodes {self.nodes:.2f} = "
                f"{self.total:.2f} CPU s, {self.total / max(wall, 1e-9):.2f} of {os.cpu_count()} cores")


class SparkCpu:
    """CPU seconds used so far by a local Spark application and by the storage nodes beside it."""

    def __init__(self, jvm_pid: int, node_pids: list[int]):
        self._jvm = psutil.Process(jvm_pid)
        self._nodes = [psutil.Process(pid) for pid in node_pids]

    @classmethod
    def of(cls, spark, node_pids: list[int]) -> "SparkCpu":
        """For the JVM of a local SparkSession (its driver runs every task: local[N])."""
        return cls(int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()), node_pids)

    def read(self) -> CpuSplit:
        workers = 0.0
        for child in self._jvm.children(recursive=True):
            try:
                times = child.cpu_times()
            except psutil.NoSuchProcess:
                continue
            workers += times.user + times.system + times.children_user + times.children_system
        jvm = self._jvm.cpu_times()
        nodes = sum(times.user + times.system for times in (node.cpu_times() for node in self._nodes))
        return CpuSplit(jvm.user + jvm.system, workers + jvm.children_user + jvm.children_system, nodes)
