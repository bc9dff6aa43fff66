"""One simulated schedule: a writer, up to three concurrent recoveries, a nemesis, then the checks.

Everything is drawn from random.Random(seed) and runs on a virtual clock, so a seed replays exactly
(with the same PYTHONHASHSEED: the client iterates over sets of node ids).

The story of a schedule: a ledger on E of 4-5 nodes; the writer appends bursts of entries, pipelined,
and then dies (its pipeline stops; what it sent is still in the network) or closes the ledger. Recoveries
start at random times, some while the writer still writes, retry when they cannot finish, and some die
half-way. The nemesis crashes, restarts, freezes and thaws nodes; the network holds, loses and reorders
messages across streams, resets add streams and cuts range reads; metadata calls are slow, and some fail
before or after they took effect. At the horizon everything heals and one last recovery closes the ledger.
Then the invariants of DESIGN section 7 are checked (invariants.py).
"""
from __future__ import annotations

import asyncio
import dataclasses
import random

from connector.client.errors import LedgerError
from connector.client.ops.close import close_own
from connector.client.runner import AddPipeline, Context, recover
from connector.client.runner.add import IDLE_LAC_AFTER, LAC_RETRY_AFTER, TICK
from metadata.errors import MetadataError
from metadata.registry import Placement
from metadata.model import Fragment, LedgerMetadata, LedgerState, NodeRegistration
from metadata.update_loop import update_ledger
from protos.digest import master_key, password_hash
from tests.simulation.clock import VirtualClockLoop
from tests.simulation.invariants import check, read_back
from tests.simulation.metadata import InMemoryStore
from tests.simulation.network import SimNetwork, SimTransport

KEY = master_key(b"")
QUORUMS = [(3, 3, 2), (3, 2, 2), (3, 3, 3), (4, 3, 2), (4, 2, 2), (3, 3, 1), (5, 3, 2)]
HORIZON = 8.0            # virtual seconds of faults
HEAL_LIMIT = 120.0        # virtual seconds for the writer and the last recovery once healed
TIMEOUT, ADD_TIMEOUT = 1.0, 2.0
LAC_WINDOW = IDLE_LAC_AFTER + LAC_RETRY_AFTER + 2 * TIMEOUT + 2 * TICK  # an idle writer's LAC reaches its nodes


class ProcessDied(BaseException):
    """A recovery's process dies right after one of its metadata calls took effect (not an error the client
    could catch: nothing of it runs any more)."""


@dataclasses.dataclass
class Outcome:
    seed: int
    violations: list[str]
    trace: list[str]
    acknowledged: int = 0
    closed_at: int = -2
    recoveries_closed: int = 0


class Scenario:
    def __init__(self, seed: int):
        self.seed = seed
        self.rng = random.Random(seed)
        self.trace: list[str] = []
        node_ids = list("abcde")[:self.rng.choice([4, 5])]
        self.quorum = self.rng.choice([q for q in QUORUMS if q[0] <= len(node_ids)])
        self.store = InMemoryStore(self.log)
        self.network = SimNetwork(self.rng, node_ids, self.log)
        self.metadata_faults = True
        self.metadata_fault_rate = self.rng.uniform(0.0, 0.03)
        self.nemesis_interval = self.rng.uniform(0.2, 2.0)   # mean seconds between nemesis actions
        self.recovery_deaths = self.rng.uniform(0.0, 0.6)    # chance that a recovery dies half-way
        self.acks: list[tuple[int, float]] = []        # (entry id, time) in completion order
        self.closes: list[tuple[str, int]] = []        # (who, last_entry_id) of every close that returned
        self.appended = 0
        self.healed = asyncio.Event()
        self.lac_violations: list[str] = []

    # -- plumbing ------------------------------------------------------------------------------------------------

    @property
    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def log(self, text: str) -> None:
        self.trace.append(f"{asyncio.get_running_loop().time():9.4f} {text}")

    def payload(self, entry_id: int) -> bytes:
        return b"seed-%d-entry-%d" % (self.seed, entry_id)

    def context(self, name: str, mortal: bool = False) -> Context:
        """mortal: the client may die right after a metadata call took effect (the crash points that matter)."""
        async def call_metadata(fn, *args):
            result = await self.call_metadata(fn, *args)
            if mortal and self.metadata_faults and self.rng.random() < self.recovery_deaths / 3:
                self.log(f"{name} dies right after a metadata call")
                raise ProcessDied(name)
            return result
        return Context(self.store, SimTransport(self.network, name), TIMEOUT, ADD_TIMEOUT,
                       call_metadata=call_metadata, placement=self.registered)

    def registered(self, store) -> Placement:
        """The registry as clients see it: a crashed node's registration is gone, a frozen one's is not (no node
        is decommissioned in a simulation: no placement epoch)."""
        nodes = {n: NodeRegistration(n, f"sim:{n}") for n, node in self.network.nodes.items() if not node.down}
        return Placement(nodes, None)

    async def call_metadata(self, fn, *args):
        """A ZooKeeper call: slow at times, and lost before or after it took effect at others."""
        rng = self.rng
        await asyncio.sleep(rng.uniform(0.2, 2.0) if self.metadata_faults and rng.random() < 0.03
                            else rng.uniform(0.001, 0.01))
        draw = rng.random() if self.metadata_faults else 1.0
        if draw < self.metadata_fault_rate / 2:
            raise MetadataError("ZooKeeper connection lost before the request (simulated)")
        result = fn(*args)
        if draw < self.metadata_fault_rate:
            raise MetadataError("ZooKeeper connection lost before the reply (simulated): outcome unknown")
        return result

    # -- actors --------------------------------------------------------------------------------------------------

    async def run(self) -> Outcome:
        e, wq, aq = self.quorum
        ensemble = tuple(self.rng.sample(sorted(self.network.nodes), e))
        current = self.store.create_ledger(LedgerMetadata(0, e, wq, aq, (Fragment(0, ensemble),),
                                                          password_hash=password_hash(b"")))
        ledger_id = current.value.ledger_id
        self.log(f"ledger {ledger_id} E={e} WQ={wq} AQ={aq} on {''.join(ensemble)} of "
                 f"{''.join(sorted(self.network.nodes))}")
        writer = asyncio.ensure_future(self.writer(current))
        recoveries = [asyncio.ensure_future(self.recovery(f"R{i + 1}", ledger_id))
                      for i in range(self.rng.choices([0, 1, 2, 3], [2, 3, 3, 2])[0])]
        nemesis = asyncio.ensure_future(self.nemesis())
        await asyncio.sleep(HORIZON)
        nemesis.cancel()
        self.heal()
        try:
            await asyncio.wait_for(asyncio.shield(writer), HEAL_LIMIT)
        except asyncio.TimeoutError:
            self.log("the writer is still waiting after the network healed")
        for task in recoveries + [writer]:
            task.cancel()
        await asyncio.gather(*recoveries, writer, nemesis, return_exceptions=True)
        final = await self.last_recovery(ledger_id)
        violations = check(self, ledger_id, final) if final is not None else [
            "liveness: no recovery could close the ledger after every fault healed"]
        violations = self.store.violations + self.lac_violations + violations
        if final is not None:
            violations += await read_back(self, ledger_id)
        return Outcome(self.seed, violations, self.trace, len(self.acks),
                       self.store.read_ledger(ledger_id).value.last_entry_id, len(self.closes))

    async def writer(self, current) -> None:
        ctx = self.context("writer")
        pipeline = AddPipeline(ctx, current, KEY)
        entries = self.rng.randint(1, 40)
        dies_at = self.rng.uniform(0.0, HORIZON) if self.rng.random() < 0.6 else None
        try:
            while self.appended < entries and (dies_at is None or self.now < dies_at):
                for _ in range(min(self.rng.randint(1, 6), entries - self.appended)):
                    self.append(pipeline)
                await asyncio.sleep(self.rng.expovariate(1 / 0.2))
            if dies_at is not None:
                await asyncio.sleep(max(0.0, dies_at - self.now))
                self.log("the writer dies")
                return
            await pipeline.drain()
            seq = pipeline.seq
            if self.rng.random() < 0.7:
                await self.idle_until_healed(pipeline)
            close = close_own(seq.ledger_id, seq.last_add_confirmed, seq.length)
            try:
                closed = await ctx.metadata(update_ledger, self.store, seq.ledger_id, close, pipeline.current)
            except LedgerError as exc:
                self.log(f"the writer's close failed: {exc}")
                return
            self.log(f"the writer closed the ledger at {closed.value.last_entry_id}")
            self.closes.append(("writer", closed.value.last_entry_id))
        finally:
            pipeline.stop()

    async def idle_until_healed(self, pipeline: AddPipeline) -> None:
        """An idle writer's LAC reaches every node of its ensemble within LAC_WINDOW once the faults heal
        (rules 2 and 17), unless a recovery took the ledger meanwhile."""
        await self.healed.wait()
        await asyncio.sleep(LAC_WINDOW)
        seq = pipeline.seq
        if seq.error is not None or self.store.read_ledger(seq.ledger_id).value.state is not LedgerState.OPEN:
            return
        behind = {n: self.network.nodes[n].lac.get(seq.ledger_id, -1) for n in seq.ensemble
                  if self.network.nodes[n].lac.get(seq.ledger_id, -1) < seq.last_add_confirmed}
        if behind:
            self.lac_violations.append(
                f"LAC lag: {LAC_WINDOW:.1f}s after every fault healed the idle writer's LAC is "
                f"{seq.last_add_confirmed}, but nodes {behind} hold less")

    def append(self, pipeline: AddPipeline) -> None:
        entry_id = self.appended
        self.appended += 1
        future = pipeline.append_async(self.payload(entry_id))

        def done(f) -> None:
            if f.exception() is None:
                self.acks.append((f.result(), self.now))
                self.log(f"writer: entry {f.result()} acknowledged")
            elif not self.acks or self.acks[-1][0] < entry_id:
                self.log(f"writer: entry {entry_id} failed: {type(f.exception()).__name__}")
        future.add_done_callback(done)

    async def recovery(self, name: str, ledger_id: int) -> None:
        await asyncio.sleep(self.rng.uniform(0.0, HORIZON))
        dies_at = self.now + self.rng.uniform(0.0, 3.0) if self.rng.random() < self.recovery_deaths else None
        task = asyncio.ensure_future(self.recover_until_closed(name, ledger_id, attempts=20))
        await asyncio.wait([task], timeout=None if dies_at is None else dies_at - self.now)
        if not task.done():
            self.log(f"{name} dies")
            task.cancel()
        elif not task.cancelled() and isinstance(task.exception(), ProcessDied):
            pass  # died after a metadata call, as logged

    async def recover_until_closed(self, name: str, ledger_id: int, attempts: int) -> LedgerMetadata | None:
        ctx = self.context(name, mortal=name != "final")
        for attempt in range(1, attempts + 1):
            self.log(f"{name} starts recovery attempt {attempt}")
            try:
                closed = await recover(ctx, self.store.read_ledger(ledger_id), KEY)
            except LedgerError as exc:
                self.log(f"{name} attempt {attempt} failed: {type(exc).__name__}: {exc}")
                await asyncio.sleep(self.rng.uniform(0.1, 1.0))
                continue
            self.log(f"{name} closed the ledger at {closed.value.last_entry_id}")
            self.closes.append((name, closed.value.last_entry_id))
            return closed.value
        return None

    async def last_recovery(self, ledger_id: int) -> LedgerMetadata | None:
        self.log("every fault healed; the last recovery")
        try:
            return await asyncio.wait_for(self.recover_until_closed("final", ledger_id, attempts=10), HEAL_LIMIT)
        except asyncio.TimeoutError:
            return None

    async def nemesis(self) -> None:
        nodes = sorted(self.network.nodes)
        while True:
            await asyncio.sleep(self.rng.expovariate(1 / self.nemesis_interval))
            node = self.rng.choice(nodes)
            target = self.network.nodes[node]
            faulty = sum(n.down or n.frozen for n in self.network.nodes.values())
            action = self.rng.random()
            if target.down:
                self.network.restart(node)
            elif target.frozen:
                self.network.thaw(node)
            elif faulty >= 2:
                continue
            elif action < 0.4:
                self.network.crash(node)
            elif action < 0.8:
                self.network.freeze(node)
            else:
                transport = self.rng.choice(self.network.transports)
                self.log(f"{transport.name}: connections to {node} reset")
                transport.connection_lost(node, "connection reset (simulated)")

    def heal(self) -> None:
        self.log("heal: every node up, no more faults")
        self.network.heal()
        self.metadata_faults = False
        self.healed.set()



def run_schedule(seed: int) -> Outcome:
    random.seed(seed)  # placement draws from the module-level generator
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(Scenario(seed).run())
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
