"""The soak's nemesis: every few seconds (seeded) one fault, each healed after its own random time.

| kind | what | heals by |
| --- | --- | --- |
| node-kill | SIGKILL a storage node | starting it again on the same data directory |
| node-pause | SIGSTOP a node for 1-20 s | SIGCONT |
| disk-full | fill a node's disk (its --disk-quota-bytes share) | deleting the filler |
| proxy | between one writer and one or two nodes: drop, delay 0.5-5 s, blackhole or a one-way cut | pass, reset |
| writer-zombie | SIGSTOP a writer for 5-20 s while another takes its stream or ledger over | SIGCONT |
| writer-kill | SIGKILL a writer | a replacement in its place (and a new stream owner) |
| session-expire | expire a writer's ZooKeeper session | (its client starts a new one) |
| zk-restart | SIGKILL or SIGTERM ZooKeeper for 1-8 s | starting it again on the same data |
| spark-driver-kill | (--spark) SIGKILL the Spark actor's group: driver, JVM, Python workers | a replacement, same checkpoint |

spark-driver-kill strikes between batch writes only, and only once the driver's streaming query committed a
micro-batch (a driver killed before its first batch, as each replacement starts on a loaded machine in 30 s or
more, can leave a short soak with no Spark rows at all): it stops the actor's group, reads its status file and
kills it only if no batch write is in flight (else it lets it go on). A streaming query killed anywhere is
fine (its restart on the same checkpoint replays the batch in flight, and the sink's sweep removes what
the killed run wrote); a batch job's driver killed mid-job would leave its task ledgers to a janitor for
dead drivers' jobs, which does not exist yet (issue 15 item 7).

At most two storage nodes are faulty at a time (kills, pauses, full disks and proxy faults count), so that a
ledger of E=3 always has nodes to move to. Each fault is logged twice to the nemesis log, when it took effect
and when it ends. `records` holds one record per fault ({"fault", "t", "t_end", "target", "nodes", ...}), made
when it took effect and completed when it ends (t_end None till then; "healed": false if its heal gave up, as
a ZooKeeper that would not start again): what the checker counts and its availability figure reads. A fault
that could not be applied (a session that did not expire) is logged and recorded as such ("applied": false),
and is no fault of the run.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import random
import signal
import time
from typing import TYPE_CHECKING, Callable

from kazoo.client import KazooClient

from connector.node_launcher import pid_alive
from connector.soak.proxy import BOTH, C2S, S2C

if TYPE_CHECKING:
    from connector.soak.run import Soak

WEIGHTS = {"node-kill": 2, "node-pause": 2, "disk-full": 1, "proxy": 3, "writer-zombie": 2, "writer-kill": 1,
           "session-expire": 1, "zk-restart": 1}
SPARK_WEIGHTS = {"spark-driver-kill": 1}  # with --spark only: a soak without it keeps its seeds' schedules
MAX_FAULTY_NODES = 2
FAULT_EVERY = (2.0, 6.0)
HEAL_SECONDS = 120.0  # a heal not over by then is logged as not healed ("healed": false) and let go
EXPIRE_SECONDS = 5.0  # the most a session expiry waits for ZooKeeper
FILLER = "soak-disk-filler"


@dataclasses.dataclass
class Fault:
    """heal starts healing; healed then says, without blocking, whether it is over: None while not yet, else
    more fields for the end record. The nemesis never waits for a heal, so one fault's heal (a node that
    cannot register while ZooKeeper is down) never holds up another's (ZooKeeper coming back)."""

    kind: str
    target: str
    nodes: tuple[str, ...]
    heal_at: float                        # time.monotonic()
    heal: Callable[[], None]
    healed: Callable[[], dict | None] = lambda: {}
    t: float = dataclasses.field(default_factory=time.time)
    detail: dict = dataclasses.field(default_factory=dict)
    healing_since: float | None = None
    applied: bool = True                  # False: it could not be applied (detail says why); nothing to heal
    record: dict = dataclasses.field(default_factory=dict)   # its entry in Nemesis.records


class Nemesis:
    def __init__(self, soak: "Soak", rng: random.Random, log_path: pathlib.Path):
        self.soak = soak
        self.rng = rng
        self.weights = {**WEIGHTS, **(SPARK_WEIGHTS if soak.spark else {})}
        self.active: list[Fault] = []
        self.records: list[dict] = []
        self._log = open(log_path, "a", buffering=1)
        self._next_at = time.monotonic() + rng.uniform(*FAULT_EVERY)

    def step(self) -> None:
        """Heal what is due, then inject the next fault if its time came."""
        now = time.monotonic()
        for fault in self._in_heal_order([f for f in self.active if f.heal_at <= now]):
            self._heal(fault)
        if now >= self._next_at:
            self._next_at = now + self.rng.uniform(*FAULT_EVERY)
            # A weighted order (Efraimidis-Spirakis): the first kind that has a target now is injected.
            kinds = sorted(self.weights, key=lambda k: self.rng.random() ** (1 / self.weights[k]), reverse=True)
            for kind in kinds:
                fault = getattr(self, "_" + kind.replace("-", "_"))()
                if fault is not None:
                    self._started(fault)
                    break

    def _started(self, fault: Fault) -> None:
        """Record a fault as it took effect (or could not be)."""
        fault.record = {"fault": fault.kind, "t": round(fault.t, 4), "t_end": None, "target": fault.target,
                        "nodes": list(fault.nodes), **fault.detail}
        self.records.append(fault.record)
        if fault.applied:
            self.active.append(fault)
            self._write({"event": "start", **fault.record})
        else:
            fault.record["applied"] = False
            self._write({"event": "not-applied", **fault.record})

    def heal_all(self) -> None:
        """Heal every fault now and wait (bounded) until each heal is over."""
        deadline = time.monotonic() + HEAL_SECONDS + 1
        while self.active and time.monotonic() < deadline:
            for fault in self._in_heal_order(self.active):
                self._heal(fault)
            time.sleep(0.2)

    @staticmethod
    def _in_heal_order(faults: list[Fault]) -> list[Fault]:
        """ZooKeeper first: a node started while it is down cannot register."""
        return sorted(faults, key=lambda f: f.kind != "zk-restart")

    def close(self) -> None:
        self._log.close()

    def _heal(self, fault: Fault) -> None:
        now = time.monotonic()
        if fault.healing_since is None:
            fault.healing_since = now
            fault.heal()
        more = fault.healed()
        if more is None:
            if now - fault.healing_since < HEAL_SECONDS:
                return
            more = {"healed": False}
        self.active.remove(fault)
        fault.record.update(t_end=round(time.time(), 4), **more)
        self._write({"event": "end", **fault.record})

    def _write(self, record: dict) -> None:
        self._log.write(json.dumps(record, separators=(",", ":")) + "\n")

    def note(self, event: str, **fields) -> None:
        """Something the soak did that is not a fault (a stream handover), for the trace."""
        self._write({"event": event, "t": round(time.time(), 4), **fields})

    # -- targets -------------------------------------------------------------------------------------

    def _faulty_nodes(self) -> set[str]:
        return {n for f in self.active for n in f.nodes}

    def _pick_nodes(self, count: int = 1) -> tuple[str, ...] | None:
        faulty = self._faulty_nodes()
        healthy = [n for n in self.soak.node_ids if n not in faulty and pid_alive(self.soak.node_pid(n))]
        count = min(count, MAX_FAULTY_NODES - len(faulty))
        if count < 1 or len(healthy) < count:
            return None
        return tuple(sorted(self.rng.sample(healthy, count)))

    def _busy_actors(self) -> set[str]:
        return {f.target for f in self.active}

    def _pick_writer(self, idle_too: bool = False):
        """A writer that is writing (the ledger writers, the stream's owner); idle_too: any stream writer too."""
        pool = self.soak.all_writers() if idle_too else self.soak.writers()
        writers = [a for a in pool if a.ready() and a.slot not in self._busy_actors()]
        return self.rng.choice(writers) if writers else None

    def _after(self, low: float, high: float) -> float:
        return time.monotonic() + self.rng.uniform(low, high)

    # -- faults --------------------------------------------------------------------------------------

    def _node_kill(self) -> Fault | None:
        nodes = self._pick_nodes()
        if nodes is None:
            return None
        node = nodes[0]
        os.kill(self.soak.node_pid(node), signal.SIGKILL)
        return Fault("node-kill", node, nodes, self._after(0, 10), lambda: self.soak.cluster.start_node(node),
                     healed=lambda: self.soak.node_restarted(node))

    def _node_pause(self) -> Fault | None:
        nodes = self._pick_nodes()
        if nodes is None:
            return None
        pid = self.soak.node_pid(nodes[0])
        os.kill(pid, signal.SIGSTOP)
        return Fault("node-pause", nodes[0], nodes, self._after(1, 20), lambda: os.kill(pid, signal.SIGCONT))

    def _disk_full(self) -> Fault | None:
        nodes = self._pick_nodes()
        if nodes is None:
            return None
        filler = self.soak.node_dir(nodes[0]) / FILLER
        with open(filler, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, self.soak.disk_quota_bytes)
        return Fault("disk-full", nodes[0], nodes, self._after(3, 15), lambda: filler.unlink(missing_ok=True))

    def _proxy(self) -> Fault | None:
        writer = self._pick_writer()
        nodes = self._pick_nodes(self.rng.choice((1, 2)))
        if writer is None or nodes is None:
            return None
        mode = self.rng.choice(("drop", "delay", "blackhole", "cut"))
        direction = {"drop": self.rng.choice((C2S, S2C, BOTH)), "cut": self.rng.choice((C2S, S2C))}.get(mode, BOTH)
        seconds = round(self.rng.uniform(0.5, 5.0), 2) if mode == "delay" else 0.0
        proxies = [self.soak.proxies[writer.slot][n] for n in nodes]
        for proxy in proxies:
            proxy.set_mode(mode, direction=direction, seconds=seconds)

        def heal() -> None:
            for proxy in proxies:
                proxy.set_mode("pass")
                if mode != "delay":
                    proxy.reset()  # dropped bytes leave a framed stream out of step; blackholed ones dead

        detail = {"mode": mode, "direction": direction, "writer": writer.name}
        if seconds:
            detail["seconds"] = seconds
        return Fault("proxy", writer.slot, nodes, self._after(2, 15), heal, detail=detail)

    def _writer_zombie(self) -> Fault | None:
        writer = self._pick_writer()
        if writer is None:
            return None
        writer.signal(signal.SIGSTOP)
        took_over = self.soak.take_over_from(writer)
        return Fault("writer-zombie", writer.slot, (), self._after(5, 20), lambda: writer.signal(signal.SIGCONT),
                     detail={"writer": writer.name, "taken_over_by": took_over})

    def _writer_kill(self) -> Fault | None:
        writer = self._pick_writer(idle_too=True)
        if writer is None:
            return None
        killed = writer.name
        writer.signal(signal.SIGKILL)
        took_over = self.soak.take_over_from(writer) if writer.role == "stream-writer" else None
        replacement = self.soak.replace(writer)
        return Fault("writer-kill", writer.slot, (), time.monotonic(), lambda: None,
                     detail={"writer": killed, "replacement": replacement.name, "taken_over_by": took_over})

    def _session_expire(self) -> Fault | None:
        writer = self._pick_writer()
        session = writer.status().get("session") if writer is not None else None
        if not session:
            return None
        other = KazooClient(hosts=self.soak.zookeeper_address, client_id=(session[0], bytes.fromhex(session[1])))
        applied = True
        try:
            other.start(timeout=EXPIRE_SECONDS)  # the same session from another connection; closing it ends it
            other.stop()
            outcome = "expired"
        except Exception as exc:  # ZooKeeper away, or the session ended already
            outcome, applied = f"not expired: {type(exc).__name__}", False
        finally:
            other.close()
        return Fault("session-expire", writer.slot, (), time.monotonic(), lambda: None, applied=applied,
                     detail={"writer": writer.name, "session": hex(session[0]), "outcome": outcome})

    def _zk_restart(self) -> Fault | None:
        if any(f.kind == "zk-restart" for f in self.active):
            return None
        how = self.rng.choice((signal.SIGKILL, signal.SIGTERM))
        self.soak.stop_zookeeper(how)
        started: list[bool] = []   # whether ZooKeeper started again, once the heal ran (it gives up after tries)
        return Fault("zk-restart", "zookeeper", (), self._after(1, 8),
                     lambda: started.append(self.soak.start_zookeeper()),
                     healed=lambda: {} if all(started) else {"healed": False}, detail={"signal": how.name})

    def _spark_driver_kill(self) -> Fault | None:
        actor = self.soak.spark_actor()
        if actor is None or not actor.status().get("progressed") or not actor.alive() \
                or actor.slot in self._busy_actors():
            return None
        actor.signal(signal.SIGSTOP)  # the whole group; with it stopped, no batch write can start
        if actor.status().get("batch"):
            actor.signal(signal.SIGCONT)
            return None
        killed = actor.name
        actor.signal(signal.SIGKILL)
        replacement = self.soak.replace(actor)
        return Fault("spark-driver-kill", actor.slot, (), time.monotonic(), lambda: None,
                     detail={"actor": killed, "replacement": replacement.name})
