"""`ledger soak`: a local cluster of five storage nodes and ZooKeeper, the workload's actors (workload.py) as
separate processes, a loopback proxy between every writer and every node, the nemesis (nemesis.py) for
--minutes, then: heal every fault, stop the actors, recover every OPEN ledger, and judge the merged history
with the checker (checker.py). Prints one line; exit status 1 on any violation.

    DIR/cluster/            the local cluster (connector/cluster.py)
    DIR/actors/NAME.jsonl   each actor's history; NAME.log its output; NAME.status.json its pid and session
    DIR/history.jsonl       the merged history, in invocation order
    DIR/nemesis.jsonl       every fault (start and end) and stream handover: the trace to read with the history
    DIR/violations.txt      what the checker found
    DIR/actors/spark-checkpoint/   with --spark: the streaming query's checkpoint (spark_actor.py)
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import logging
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from connector.client import LedgerClient
from connector.cluster import LocalCluster, pid_alive, wait_gone
from connector.soak import checker
from connector.soak.history import merge
from connector.soak.nemesis import FILLER, HEAL_SECONDS, Nemesis
from connector.soak.proxy import TcpProxy
from connector.soak.spark_actor import ROWS_PER_SECOND, SPARK_STREAM

NODES = 5
STREAM = "soak"
DISK_QUOTA_BYTES = 2 << 30
HANDOVER_EVERY = (15.0, 25.0)
ACTOR_STOP_SECONDS = 90.0
SPARK_STOP_SECONDS = 180.0  # the Spark actor's batch write in flight, its query's stop and its last drain run
SPARK_START_SECONDS = 300.0  # the most the timed run waits for the Spark actor's first micro-batch (a loaded machine)
CLUSTER_START_SECONDS = 120.0
RECOVERY_SECONDS = 300.0  # the final recovery of every OPEN ledger, retried for this long in all
MAX_RESTARTS = 50  # per slot
WRITER_SLOTS = {  # slot -> role and its arguments; each writer slot has its own proxy to every node
    "sw-1": ("stream-writer", ["--own", "--rate", "40", "--window", "16"]),
    "sw-2": ("stream-writer", ["--rate", "40", "--window", "16"]),
    "sw-3": ("stream-writer", ["--rate", "40", "--window", "16"]),
    "lw-1": ("ledger-writer", ["--quorum", "3,2,2", "--rate", "30", "--window", "8"]),
    "lw-2": ("ledger-writer", ["--quorum", "3,3,2", "--rate", "30", "--window", "8"]),
}
OTHER_SLOTS = {
    "reader": ("ledger-reader", []),
    "stream-reader": ("stream-reader", []),
    "janitor": ("janitor", []),
    "auditor": ("auditor", []),
}
# The nodes' sessions end soon after a kill or a long pause, so the auditor (LOST_AFTER) moves their fragments, and
# their garbage collection looks for over-replicated copies often, with a short grace: what a node back from a fault
# holds of ledgers moved meanwhile is dropped while repairs may be copying to it.
NODE_GC_ARGS = ("--zk-session-timeout", "3", "--gc-interval", "2", "--gc-grace", "5",
                "--gc-overreplicated-interval", "5")
GROUP_SIGNALS = (signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT)
SPARK_SLOT = "spark"  # with --spark: its own process (and its JVM and Python workers, one process group)
TRACEBACK = "Traceback (most recent call last):"
# What Python writes before the traceback of an exception that escaped where nothing catches it: a thread's
# target (threading.excepthook), an asyncio task nobody awaited, an event loop callback. Tracebacks a library
# logs of errors it handled, or "Exception ignored in" at interpreter exit (grpc's teardown), are not crashes.
ESCAPED = ("Exception in thread", "exception was never retrieved", "Exception in callback")
ESCAPED_LINES = 12   # how far above its traceback the mark may be (asyncio's future repr of a gRPC error: 6 lines)


@dataclasses.dataclass
class ActorProcess:
    """One slot of the workload: its current process (a generation) and how to start the next one."""

    slot: str
    role: str
    args: list[str]
    directory: pathlib.Path
    generation: int = 0
    process: subprocess.Popen | None = None
    expected_exit: bool = False
    group: bool = False  # signal the whole process group (the Spark actor: its JVM and Python workers too)

    @property
    def name(self) -> str:
        return f"{self.slot}.{self.generation}"

    def start(self, command: list[str]) -> None:
        self.generation += 1
        self.expected_exit = False
        with open(self.directory / f"{self.name}.log", "ab") as log:
            self.process = subprocess.Popen(
                [*command, self.role, "--actor", self.name, *self.args], stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,  # Ctrl-C reaches the soak, which stops them
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def status(self) -> dict:
        try:
            return json.loads((self.directory / f"{self.name}.status.json").read_text())
        except (OSError, ValueError):
            return {}

    def ready(self) -> bool:
        """Running and connected (its signal handlers are in place by then)."""
        return self.alive() and bool(self.status())

    def signal(self, sig: signal.Signals) -> None:
        if sig == signal.SIGKILL:
            self.expected_exit = True
        if self.group and sig in GROUP_SIGNALS and self.process is not None:
            try:  # the leader may be gone and its JVM not yet: the group (its own session) outlives it
                os.killpg(self.process.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        elif self.alive():  # SIGTERM to the leader only: it stops its query and its JVM itself
            os.kill(self.process.pid, sig)


class Soak:
    def __init__(self, minutes: float, seed: int, directory: pathlib.Path, history: pathlib.Path | None = None,
                 echo: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
                 spark: bool = False):
        self.minutes = minutes
        self.seed = seed
        self.spark = spark
        self.directory = directory.resolve()
        self.history_path = (history or self.directory / "history.jsonl").resolve()
        self.echo = echo
        self.rng = random.Random(seed)
        self.disk_quota_bytes = DISK_QUOTA_BYTES
        self.cluster = LocalCluster(self.directory / "cluster", nodes=NODES,
                                    node_args=("--disk-quota-bytes", str(DISK_QUOTA_BYTES), *NODE_GC_ARGS))
        self.actors_dir = self.directory / "actors"
        self.proxies: dict[str, dict[str, TcpProxy]] = {}
        self.actors: dict[str, ActorProcess] = {}
        self.owner: str | None = None
        self.crashes: list[str] = []
        self._crashed: set[str] = set()   # the actors (by name: slot and generation) in crashes
        self._crashes_per_slot: collections.Counter = collections.Counter()
        self.nemesis: Nemesis | None = None
        self.metadata_uri = ""
        self._until = 0.0

    # -- what the nemesis acts on ----------------------------------------------------------------------

    @property
    def node_ids(self) -> list[str]:
        return [spec.node_id for spec in self.cluster.state.nodes]

    @property
    def zookeeper_address(self) -> str:
        return f"127.0.0.1:{self.cluster.state.zk_port}"

    def node_pid(self, node_id: str) -> int:
        return self.cluster.node(node_id).pid

    def node_dir(self, node_id: str) -> pathlib.Path:
        return self.cluster.node_dir(node_id)

    def writers(self) -> list[ActorProcess]:
        """The writers that are writing: the ledger writers and the stream's current owner."""
        return [a for a in self.actors.values()
                if a.role == "ledger-writer" or (a.role == "stream-writer" and a.slot == self.owner)]

    def all_writers(self) -> list[ActorProcess]:
        return [a for a in self.actors.values() if a.slot in WRITER_SLOTS]

    def spark_actor(self) -> ActorProcess | None:
        return self.actors.get(SPARK_SLOT)

    @property
    def spark_checkpoint(self) -> pathlib.Path:
        return self.actors_dir / "spark-checkpoint"

    def node_restarted(self, node_id: str) -> dict | None:
        """Whether a node started again serves (it says so once it registered): None while not; a node that
        gave up (started while ZooKeeper was away) is started once more."""
        if _serving(self.cluster.node(node_id).address):
            return {}
        self.cluster.start_node(node_id)
        return None

    def stop_zookeeper(self, how: signal.Signals) -> None:
        pid = self.cluster.state.zk_pid
        os.kill(pid, how)
        if not wait_gone(pid, 20):
            os.kill(pid, signal.SIGKILL)

    def start_zookeeper(self) -> bool:
        """Whether ZooKeeper started (five tries)."""
        for _ in range(5):
            try:
                self.cluster.start_zookeeper(timeout=60)
                return True
            except Exception as exc:  # e.g. the port not free yet: try again
                self.echo(f"soak: ZooKeeper did not start ({exc}); trying again")
                time.sleep(1)
        self.echo("soak: ZooKeeper did not start in five tries; the fault is reported as not healed")
        return False

    def take_over_from(self, writer: ActorProcess) -> str | None:
        """Another actor takes over what `writer` writes: another stream writer the stream, the janitor a
        ledger writer's ledgers. Returns who."""
        if writer.role == "ledger-writer":
            writer_id = writer.status().get("writer_id")
            if not writer_id:
                return None
            requests = self.actors_dir / "requests"
            (requests / f"{time.time_ns()}.json").write_text(json.dumps({"writer_id": writer_id}))
            return self.actors["janitor"].name
        if writer.slot != self.owner:
            return None
        return self._hand_stream_over(exclude=writer.slot)

    def _hand_stream_over(self, exclude: str | None = None) -> str | None:
        busy = {f.target for f in self.nemesis.active} if self.nemesis else set()
        candidates = [a for a in self.actors.values() if a.role == "stream-writer" and a.ready()
                      and a.slot not in (exclude, self.owner) and a.slot not in busy]
        if not candidates:
            return None
        new_owner = self.rng.choice(candidates)
        new_owner.signal(signal.SIGUSR1)
        self.owner = new_owner.slot
        self.nemesis.note("handover", stream=STREAM, to=new_owner.name)
        return new_owner.name

    def replace(self, actor: ActorProcess) -> ActorProcess:
        actor.signal(signal.SIGKILL)
        if actor.process is not None:
            actor.process.wait(10)
        if "--own" in actor.args:
            actor.args = [a for a in actor.args if a != "--own"]
        actor.start(self._actor_command(actor.slot))
        return actor

    # -- the run ---------------------------------------------------------------------------------------

    def run(self) -> int:
        signal.signal(signal.SIGTERM, _interrupt)  # stop everything as on Ctrl-C
        try:
            self._start()
            self._wait_for_spark()
            self._drive()
            return self._finish()
        except KeyboardInterrupt:
            self.echo(f"soak: interrupted; stopping everything (the trace so far is in {self.directory})")
            raise
        finally:
            self._cleanup()

    def _start(self) -> None:
        try:
            if self.directory.exists() and any(self.directory.iterdir()):
                raise SystemExit(f"ledger soak: --dir {self.directory} is not empty; give a new or empty directory")
            (self.actors_dir / "requests").mkdir(parents=True)
        except OSError as exc:   # a file, or a place this user cannot create it
            raise SystemExit(f"ledger soak: --dir {self.directory} cannot hold the soak ({exc.strerror}); give a new "
                             "or empty directory this user can write") from None
        logging.getLogger("kazoo").setLevel(logging.ERROR)  # a reconnect loop per ZooKeeper restart
        self.metadata_uri = self.cluster.start(timeout=CLUSTER_START_SECONDS)
        self.nemesis = Nemesis(self, self.rng, self.directory / "nemesis.jsonl")
        for slot in WRITER_SLOTS:
            self.proxies[slot] = {spec.node_id: TcpProxy("127.0.0.1", spec.port).start()
                                  for spec in self.cluster.state.nodes}
        # Actors stop by themselves at _until (also if this process dies): after the drive, the heal (up to
        # HEAL_SECONDS), the cluster's restart and the final SIGTERM, so that none exits before it on a slow machine
        # (an exit before the SIGTERM is a crash).
        # The cluster's start waits for ZooKeeper and then for the nodes, each up to CLUSTER_START_SECONDS, and a
        # heal's own work may run past HEAL_SECONDS: twice each.
        self._until = (time.time() + self.minutes * 60 + 2 * HEAL_SECONDS + 2 * CLUSTER_START_SECONDS
                       + self._stop_seconds + 120 + (SPARK_START_SECONDS if self.spark else 0))
        for slot, (role, args) in self._slots().items():
            self.actors[slot] = ActorProcess(slot, role, list(args), self.actors_dir, group=slot == SPARK_SLOT)
            self.actors[slot].start(self._actor_command(slot))
        self.owner = "sw-1"
        self.echo(f"soak: {NODES} storage nodes and ZooKeeper at {self.metadata_uri}, {len(self.actors)} actors, "
                  f"seed {self.seed}, {self.minutes:g} minutes; trace in {self.directory}")

    def _wait_for_spark(self) -> None:
        """With --spark, the timed run starts once the Spark actor's streaming query committed a micro-batch: a
        SparkSession can take a minute to start on a loaded machine, a run that ended before it would test no Spark
        at all, and the nemesis kills a driver only once it progressed. The other actors work meanwhile, without
        faults."""
        actor = self.spark_actor()
        if actor is None:
            return
        deadline = time.monotonic() + SPARK_START_SECONDS
        while not actor.status().get("progressed"):
            if not actor.alive() or time.monotonic() > deadline:
                raise SystemExit(f"ledger soak: the Spark actor's query committed no micro-batch within "
                                 f"{SPARK_START_SECONDS:.0f}s (alive: {actor.alive()}); its log: "
                                 f"{self.actors_dir / (actor.name + '.log')}")
            time.sleep(0.2)

    def _slots(self) -> dict[str, tuple[str, list[str]]]:
        slots = {**WRITER_SLOTS, **OTHER_SLOTS}
        if self.spark:
            slots[SPARK_SLOT] = ("spark", ["--spark-stream", SPARK_STREAM, "--checkpoint", str(self.spark_checkpoint)])
        return slots

    @property
    def _stop_seconds(self) -> float:
        return SPARK_STOP_SECONDS if self.spark else ACTOR_STOP_SECONDS

    def _actor_command(self, slot: str) -> list[str]:
        command = [sys.executable, "-m", "connector.soak.workload"]
        options = ["--metadata", self.metadata_uri, "--dir", str(self.actors_dir), "--seed", str(self.seed),
                   "--until", str(self._until), "--stream", STREAM]
        if slot in self.proxies:
            addresses = {node: proxy.address for node, proxy in self.proxies[slot].items()}
            options += ["--node-addresses", json.dumps(addresses)]
        return command + options

    def _drive(self) -> None:
        started = time.monotonic()
        end = started + self.minutes * 60
        next_handover = started + self.rng.uniform(*HANDOVER_EVERY)
        next_progress = started + 60
        while time.monotonic() < end:
            self.nemesis.step()
            if time.monotonic() >= next_handover:
                self._hand_stream_over()
                next_handover = time.monotonic() + self.rng.uniform(*HANDOVER_EVERY)
            self._supervise()
            if time.monotonic() >= next_progress:
                next_progress += 60
                self.echo(f"soak: {(time.monotonic() - started) / 60:.0f}/{self.minutes:g} minutes, "
                          f"{len(self.nemesis.records)} faults")
            time.sleep(0.2)

    def _supervise(self, restart: bool = True) -> None:
        """An actor that exited without being killed crashed: note it and start its slot again. So did a storage
        node that exited while no fault stopped it."""
        self._supervise_nodes(restart)
        for actor in self.actors.values():
            if actor.process is not None and not actor.alive() and not actor.expected_exit:
                self._crash(actor.name, f"actor {actor.name} exited with status {actor.process.returncode}; see "
                                        f"{self.actors_dir / (actor.name + '.log')}")
                self.echo(f"soak: {self.crashes[-1]}")
                actor.expected_exit = True
                self._crashes_per_slot[actor.slot] += 1
                if restart and self._crashes_per_slot[actor.slot] <= MAX_RESTARTS:
                    self.replace(actor)

    def _supervise_nodes(self, restart: bool) -> None:
        """A serving node never exits on its own (only a start it refuses ends its process): one that is gone while
        no node-kill holds it down crashed. It is noted and started again (a fault never targets a gone process).
        Nodes are watched from the nemesis's making, once the cluster runs."""
        if self.nemesis is None:
            return
        held_down = {node for fault in self.nemesis.active if fault.kind == "node-kill" for node in fault.nodes}
        for node in self.node_ids:
            if node in held_down or pid_alive(self.node_pid(node)) or self._crashes_per_slot[node] > MAX_RESTARTS:
                continue
            log = self.cluster.log_file(node)
            self._crash(node, f"storage node {node} exited with no fault stopping it ({_last_line(log)}); see {log}")
            self.echo(f"soak: {self.crashes[-1]}")
            self._crashes_per_slot[node] += 1
            if restart and self._crashes_per_slot[node] <= MAX_RESTARTS:
                self.cluster.start_node(node)

    def _finish(self) -> int:
        self.echo("soak: healing every fault, stopping the actors, recovering every open ledger")
        self.nemesis.heal_all()
        self._supervise(restart=False)
        for actor in self.actors.values():
            actor.signal(signal.SIGCONT)
        self.cluster.start(timeout=CLUSTER_START_SECONDS)
        self._stop_actors()
        records = merge(sorted(self.actors_dir.glob("*.jsonl")), self.history_path)
        with LedgerClient(self.metadata_uri, timeout=5.0) as client:
            for error in checker.recover_all(client, RECOVERY_SECONDS):
                self.echo(f"soak: final recovery failed: {error}")
            final = checker.FinalState.read(client, [STREAM], arrow_streams=[SPARK_STREAM] if self.spark else [])
            report = checker.check(final, records, self.nemesis.records)
            if self.spark:
                self._check_spark(client, records, report)
        report.violations += [checker.Violation("crashed", c) for c in self.crashes]
        line = report.line(self.minutes, self.seed)
        if report.ok:
            print(line, flush=True)
            return 0
        violations = self.directory / "violations.txt"
        violations.write_text("".join(f"{v.kind}: {v.detail}\n" for v in report.violations))
        for v in report.violations[:20]:
            self.echo(f"soak: {v.kind}: {v.detail}")
        print(line, flush=True)
        print(f"soak: FAILED with seed {self.seed}: {len(report.violations)} violations in {violations}; history "
              f"{self.history_path}, faults and handovers {self.directory / 'nemesis.jsonl'}; run again with "
              f"`ledger soak --seed {self.seed} --minutes {self.minutes:g}{' --spark' if self.spark else ''}`",
              flush=True)
        return 1

    def _check_spark(self, client: LedgerClient, records: list[dict], report: checker.Report) -> None:
        """Read the Spark stream with Spark (a session of the soak's own, after the actors stopped) and judge it."""
        from connector.soak import spark_actor

        self.echo("soak: reading the Spark stream back with Spark")
        with spark_actor.checker_session() as session:
            output = spark_actor.read_output(session, client.store, self.metadata_uri, SPARK_STREAM,
                                             self.spark_checkpoint, ROWS_PER_SECOND)
            violations, report.spark = checker.check_spark(output, records)
        report.violations += violations

    def _stop_actors(self) -> None:
        """SIGTERM every actor and wait: each must stop in time, with status 0 (or killed by the SIGTERM itself,
        which came before its handler was in place); any other status is a crash (an exception, say)."""
        self._supervise(restart=False)   # those that died since: crashes of their own, not of the stop
        running = [actor for actor in self.actors.values() if actor.alive()]
        for actor in self.actors.values():
            actor.expected_exit = True
            actor.signal(signal.SIGTERM)
        deadline = time.monotonic() + self._stop_seconds
        for actor in self.actors.values():
            if actor.process is None:
                continue
            log = self.actors_dir / (actor.name + ".log")
            try:
                status = actor.process.wait(max(0.1, deadline - time.monotonic()))
                if actor in running and status not in (0, -signal.SIGTERM):
                    self._crash(actor.name, f"actor {actor.name} exited with status {status} after the final SIGTERM "
                                            f"({_last_line(log)}); see {log}")
            except subprocess.TimeoutExpired:
                self._crash(actor.name, f"actor {actor.name} did not stop within {self._stop_seconds:.0f}s of "
                                        f"SIGTERM; see {log}")
                actor.signal(signal.SIGKILL)
                actor.process.wait(10)
            if actor.group:
                actor.signal(signal.SIGKILL)  # what is left of its group (a JVM that outlived its driver)
        self._check_logs()

    def _crash(self, name: str, what: str) -> None:
        self.crashes.append(what)
        self._crashed.add(name)

    def _check_logs(self) -> None:
        """An exception that escaped in an actor that lived on (in a thread, a callback) leaves only a traceback in
        its log (after one of ESCAPED): each actor's log is read once all stopped (not the Spark actor's, whose
        driver logs its tasks' tracebacks, which a node fault causes and Spark retries)."""
        for log in sorted(self.actors_dir.glob("*.log")):
            name = log.name.removesuffix(".log")
            if name in self._crashed or name.split(".")[0] == SPARK_SLOT:
                continue
            lines = log.read_text(errors="replace").splitlines()
            starts = [i for i, line in enumerate(lines) if line.startswith(TRACEBACK)
                      and any(mark in before for before in lines[max(0, i - ESCAPED_LINES):i] for mark in ESCAPED)]
            if starts:
                error = next((line for line in lines[starts[-1] + 1:] if not line.startswith(" ")), "")
                self._crash(name, f"actor {name}'s log holds {len(starts)} traceback(s) (an exception escaped in a "
                                  f"thread or a callback; the last: {error[:300]}); see {log}")

    def _cleanup(self) -> None:
        """Whatever happened (also Ctrl-C): every process and proxy started is stopped, every filler removed."""
        for actor in self.actors.values():
            actor.signal(signal.SIGCONT)
            actor.signal(signal.SIGKILL)
            if actor.process is not None:
                actor.process.wait(10)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:  # each close may wait for its connections
            list(pool.map(TcpProxy.close, [p for proxies in self.proxies.values() for p in proxies.values()]))
        if self.nemesis is not None:
            self.nemesis.close()
        if self.cluster.state is not None:
            for spec in self.cluster.state.nodes:
                (self.node_dir(spec.node_id) / FILLER).unlink(missing_ok=True)
                if pid_alive(spec.pid):
                    os.kill(spec.pid, signal.SIGCONT)
            self.cluster.stop()


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def _last_line(path: pathlib.Path) -> str:
    """The last line of an actor's log (an exception's, after a traceback), or what says there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError as exc:
        return f"its log cannot be read: {exc}"
    return f"its log ends: {lines[-1][:300]}" if lines else "its log is empty"


def _serving(address: str) -> bool:
    """The node's health service says SERVING (it does once registered), asked without ZooKeeper: the soak
    never blocks on ZooKeeper, which may be the thing that is down."""
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
    except grpc.RpcError:
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def default_directory() -> pathlib.Path:
    import tempfile

    return pathlib.Path(tempfile.mkdtemp(prefix="ledger-soak-"))


def remove_cluster_data(directory: pathlib.Path) -> None:
    shutil.rmtree(directory / "cluster", ignore_errors=True)
