"""The soak's actors, each its own OS process so that the nemesis can SIGSTOP or SIGKILL it:

    python -m connector.soak.workload ROLE --actor NAME --metadata URI --dir DIR --seed S [options]

- stream-writer: one of the writers of a stream. It waits until told to take the stream over (SIGUSR1, or
  --own at start), then appends until another writer fences it; it rolls to a new ledger every few hundred
  entries.
- ledger-writer: creates ledgers of --quorum E,WQ,AQ one after another and appends a few hundred to a few
  thousand entries to each, then closes it.
- ledger-reader: tails the newest ledgers without fencing them (open_ledger(recover=False), wait_lac).
- stream-reader: tails the stream with Streams.read.
- auditor: `ledger audit --watch` with a short --lost-after: re-replicates the fragments of nodes the nemesis keeps
  away, which then drop their over-replicated copies once back.
- janitor: recovers ledgers whose writer is gone (its ZooKeeper session ended), and takes over the ledgers
  of a writer the nemesis paused (a file DIR/requests/*.json names its writer id).
- spark (`ledger soak --spark`): a streaming query (rate source -> ledger sink) and a batch writer in one
  SparkSession, writing the stream --spark-stream (spark_actor.py).

Every operation goes to DIR/NAME.jsonl (history.py); DIR/NAME.status.json holds the actor's pid, writer id
and ZooKeeper session, which the nemesis uses to expire that session. SIGTERM ends an actor cleanly (its
writers close); so do --until and the death of the soak process. Every wait is bounded.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import json
import logging
import os
import pathlib
import random
import signal
import sys
import threading
import time
from typing import Callable

from connector.client import LedgerClient, LedgerError, NoSuchLedgerError, Streams
from connector.client.retry import Retry
from connector.soak import spark_actor
from connector.soak.history import FAILED, OK, UNKNOWN, HistoryWriter, digest, payload
from metadata.errors import NoSuchStreamError

STUCK_AFTER = 60.0      # an append unanswered this long: the writer gives its client up
ROLL_EVERY = (200, 600)  # entries per ledger of a stream writer
LEDGER_ENTRIES = (200, 3000)
PAYLOAD_BYTES = (32, 4096)
READ_BATCH = 500
TAILED_LEDGERS = 6
LOST_AFTER = 2.0          # the auditor's --lost-after: a node unregistered this long has its fragments moved
AUDIT_FULL_SECONDS = 30.0


@dataclasses.dataclass
class _Pending:
    index: int
    future: concurrent.futures.Future
    t: float
    size: int
    digest: str
    done_at: list


class Actor:
    """What every role shares: its history, its client, its stop and take-over flags."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.name = args.actor
        self.dir = pathlib.Path(args.dir)
        self.history = HistoryWriter(self.dir / f"{self.name}.jsonl", self.name)
        self.rng = random.Random(f"{args.seed}/{self.name}")
        self.stop = threading.Event()
        self.takeover = threading.Event()
        self.parent = os.getppid()
        self.client: LedgerClient | None = None
        self.writing: Callable[[], bool] = lambda: False   # whether it is meant to append now (a writer's role sets it)
        self._session: tuple | None = None
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        signal.signal(signal.SIGUSR1, lambda *_: self.takeover.set())

    def stopping(self) -> bool:
        if time.time() >= self.args.until or os.getppid() != self.parent:
            self.stop.set()
        return self.stop.is_set()

    def pause(self, seconds: float) -> None:
        self.stop.wait(seconds)

    # -- the client ----------------------------------------------------------------------------------

    def connect(self) -> LedgerClient | None:
        """A client (through this actor's proxies, if it has them), retried while ZooKeeper is away. A failed
        connect of a writer that is meant to append says so (writing: the checker counts it as unavailable)."""
        while not self.stopping():
            t = time.time()
            try:
                self.client = LedgerClient(self.args.metadata, timeout=3.0, add_timeout=5.0,
                                           node_addresses=json.loads(self.args.node_addresses))
            except LedgerError as exc:
                self.history.record("connect", FAILED, t, error=_describe(exc), writing=self.writing())
                self.pause(1.0)
                continue
            self.history.record("connect", OK, t, writer_id=self.client.writer_id)
            self.publish_status()
            return self.client
        return None

    def abandon_client(self) -> None:
        """Give up a client whose calls hang: close it on a side thread (its close may hang too)."""
        client, self.client = self.client, None
        if client is not None:
            threading.Thread(target=client.close, daemon=True).start()

    def publish_status(self) -> None:
        """Rewrite the status file when the ZooKeeper session changed (the nemesis expires it from there)."""
        client = self.client
        session = client.store.zk.client_id if client is not None else None
        if session == self._session:
            return
        self._session = session
        self.write_status({"actor": self.name, "pid": os.getpid(), "role": self.args.role,
                           "writer_id": client.writer_id if client else None,
                           "session": [session[0], session[1].hex()] if session else None})

    def write_status(self, status: dict) -> None:
        """Replace the status file in one rename: a reader (the nemesis) never sees half of it."""
        tmp = self.dir / f"{self.name}.status.tmp"
        tmp.write_text(json.dumps(status))
        tmp.replace(self.dir / f"{self.name}.status.json")

    def random_size(self) -> int:
        low, high = PAYLOAD_BYTES
        return int(low * (high / low) ** self.rng.random())

    # -- appending -----------------------------------------------------------------------------------

    def append_many(self, append: Callable[[bytes], concurrent.futures.Future], ledger_id: int, first: int,
                    count: int, op: str, fields: dict, result_field: str) -> str:
        """Append entries first..first+count-1 of ledger_id with at most --window in flight at --rate per
        second, recording each outcome (an ack's result as result_field). Returns 'done', 'failed' (the ledger
        took an error: stop using it), 'stuck' (an append went unanswered for STUCK_AFTER: give the client up),
        'stopped' or 'interrupted' (a take-over was asked for). An append that raised was refused before it was
        sent: it is recorded failed, with its payload's digest (the checker looks for it in the ledger)."""
        pending: collections.deque[_Pending] = collections.deque()
        sent = 0
        failed = False
        next_at = time.monotonic()
        interval = 1.0 / self.args.rate
        while True:
            halt = self.stopping() or (op == "stream-append" and self.takeover.is_set())
            while (sent < count and not failed and not halt and len(pending) < self.args.window
                   and time.monotonic() >= next_at):
                index = first + sent
                data = payload(self.name, ledger_id, index, self.random_size())
                t = time.time()
                try:
                    future = append(data)
                except LedgerError as exc:
                    self.history.record(op, FAILED, t, ledger=ledger_id, entry=index, size=len(data),
                                        digest=digest(data), error=_describe(exc), **fields)
                    failed = True
                    break
                done_at: list = []
                future.add_done_callback(lambda _, d=done_at: d.append(time.time()))
                pending.append(_Pending(index, future, t, len(data), digest(data), done_at))
                sent += 1
                next_at = max(next_at + interval, time.monotonic() - 1.0)
            if not pending:
                if failed:
                    return "failed"
                if halt:
                    return "stopped" if self.stop.is_set() else "interrupted"
                if sent >= count:
                    return "done"
                time.sleep(max(0.0, min(next_at - time.monotonic(), 0.5)))
                continue
            head = pending[0]
            wait = 0.5 if sent >= count or failed or halt else max(0.0, next_at - time.monotonic())
            concurrent.futures.wait([head.future], timeout=min(wait, 0.5))
            if head.future.done():
                pending.popleft()
                failed |= not self._record_append(head, ledger_id, op, fields, result_field)
            elif time.time() - head.t > STUCK_AFTER:
                for p in pending:
                    self.history.record(op, UNKNOWN, p.t, ledger=ledger_id, entry=p.index, size=p.size,
                                        digest=p.digest, error=f"no answer within {STUCK_AFTER:.0f}s", **fields)
                return "stuck"
            self.publish_status()

    def _record_append(self, p: _Pending, ledger_id: int, op: str, fields: dict, result_field: str) -> bool:
        t_end = p.done_at[0] if p.done_at else time.time()
        common = dict(ledger=ledger_id, entry=p.index, size=p.size, digest=p.digest, t_end=t_end, **fields)
        exc = p.future.exception()
        if exc is not None:
            self.history.record(op, UNKNOWN, p.t, error=_describe(exc), **common)
            return False
        self.history.record(op, OK, p.t, **{result_field: p.future.result()}, **common)
        return True


# -- roles -------------------------------------------------------------------------------------------------


def run_ledger_writer(actor: Actor) -> None:
    e, wq, aq = (int(x) for x in actor.args.quorum.split(","))
    actor.writing = lambda: True
    while not actor.stopping():
        client = actor.client or actor.connect()
        if client is None:
            return
        t = time.time()
        try:
            handle = client.create_ledger(e, wq, aq, custom_metadata={"soak_actor": actor.name, "soak_role": "ledger"})
        except LedgerError as exc:
            actor.history.record("create", UNKNOWN, t, quorum=[e, wq, aq], error=_describe(exc))
            actor.pause(1.0)
            continue
        actor.history.record("create", OK, t, ledger=handle.ledger_id, quorum=[e, wq, aq])
        count = actor.rng.randint(*LEDGER_ENTRIES)
        outcome = actor.append_many(handle.append_async, handle.ledger_id, 0, count, "append", {}, "acked_entry")
        if outcome == "stuck":
            actor.abandon_client()
            continue
        t = time.time()
        try:
            closed = handle.close()
        except LedgerError as exc:
            actor.history.record("close", UNKNOWN, t, ledger=handle.ledger_id, error=_describe(exc))
            continue
        actor.history.record("close", OK, t, ledger=handle.ledger_id, last_entry=closed.last_entry_id)


def run_stream_writer(actor: Actor) -> None:
    stream = actor.args.stream
    writer = None
    entries = 0
    roll_at = 0
    if actor.args.own:
        actor.takeover.set()
    actor.writing = lambda: writer is not None or actor.takeover.is_set()   # it holds the stream or was asked to
    while not actor.stopping():
        client = actor.client or actor.connect()  # connected also while idle: ready to be asked
        if client is None:
            return
        actor.publish_status()
        if writer is None and not actor.takeover.wait(0.2):
            continue
        if actor.takeover.is_set():
            actor.takeover.clear()
            t = time.time()
            try:
                writer = Streams(client).open_writer(stream, max_ledger_bytes=None)
            except LedgerError as exc:
                actor.history.record("takeover", UNKNOWN, t, stream=stream, error=_describe(exc))
                writer = None
                actor.pause(1.0)
                continue
            actor.history.record("takeover", OK, t, stream=stream, ledger=writer.ledger_id, owner=writer.owner_id)
            entries, roll_at = 0, actor.rng.randint(*ROLL_EVERY)
        if entries >= roll_at:
            t = time.time()
            old = writer.ledger_id
            try:
                writer.roll()
            except LedgerError as exc:
                actor.history.record("roll", UNKNOWN, t, stream=stream, ledger=old, error=_describe(exc))
                writer = None
                continue
            actor.history.record("roll", OK, t, stream=stream, ledger=old, new_ledger=writer.ledger_id)
            entries, roll_at = 0, actor.rng.randint(*ROLL_EVERY)
        count = min(50, roll_at - entries)
        outcome = actor.append_many(writer.append_async, writer.ledger_id, entries, count, "stream-append",
                                    {"stream": stream}, "offset")
        entries += count
        if outcome == "stuck":
            writer = None
            actor.abandon_client()
        elif outcome == "failed":
            writer = None  # fenced (another owner) or broken: wait to be asked to take over again
    if writer is not None:
        t = time.time()
        try:
            writer.close()
            actor.history.record("stream-close", OK, t, stream=stream, ledger=writer.ledger_id)
        except LedgerError as exc:
            actor.history.record("stream-close", UNKNOWN, t, stream=stream, ledger=writer.ledger_id,
                                 error=_describe(exc))


def run_ledger_reader(actor: Actor) -> None:
    """Tails the newest ledgers up to their LAC (never fencing them); a ledger is done once read to its close."""
    handles = {}
    next_entry: dict[int, int] = {}
    finished: set[int] = set()
    while not actor.stopping():
        client = actor.client or actor.connect()
        if client is None:
            return
        t = time.time()
        try:
            newest = sorted(set(client.list_ledgers()) - finished)[-TAILED_LEDGERS:]
        except LedgerError as exc:
            actor.history.record("list", FAILED, t, error=_describe(exc))
            actor.pause(1.0)
            continue
        for ledger_id in newest:
            if actor.stopping():
                break
            t = time.time()
            try:
                handle = handles.get(ledger_id) or client.open_ledger(ledger_id, recover=False)
                if handle.metadata.custom.get("stream", actor.args.stream) != actor.args.stream:
                    finished.add(ledger_id)  # a Spark ledger (--spark): Arrow entries, judged by the Spark check
                    continue
                handles[ledger_id] = handle
                first = next_entry.get(ledger_id, 0)
                if ledger_id == newest[-1]:  # the newest: a long poll until its LAC reaches `first`
                    last = handle.wait_lac(previous=first - 1, timeout=0.5)
                else:
                    last = handle.read_lac()
                if last >= first:
                    last = min(last, first + READ_BATCH - 1)
                    digests = [digest(e.payload) for e in handle.read(first, last)]
                    actor.history.record("read", OK, t, ledger=ledger_id, first=first, digests=digests,
                                         closed=handle.is_closed)
                    next_entry[ledger_id] = first + len(digests)
                if handle.is_closed and next_entry.get(ledger_id, 0) > handle.last_entry_id:
                    finished.add(ledger_id)
                    handles.pop(ledger_id, None)
            except NoSuchLedgerError:
                finished.add(ledger_id)  # deleted: a stream writer discarded a ledger it could not register
                handles.pop(ledger_id, None)
            except LedgerError as exc:
                actor.history.record("read", FAILED, t, ledger=ledger_id, error=_describe(exc))
                handles.pop(ledger_id, None)
        for ledger_id in set(handles) - set(newest):
            handles.pop(ledger_id)
        actor.publish_status()
        actor.pause(0.2)


def run_stream_reader(actor: Actor) -> None:
    stream = actor.args.stream
    next_offset = 0
    while not actor.stopping():
        client = actor.client or actor.connect()
        if client is None:
            return
        t = time.time()
        batch: list[list] = []
        try:
            for entry in Streams(client).read(stream, start=next_offset):
                batch.append([entry.offset, entry.ledger_id, entry.entry_id, digest(entry.payload)])
                if len(batch) >= READ_BATCH or actor.stopping():
                    break
        except NoSuchStreamError:
            pass
        except LedgerError as exc:
            actor.history.record("stream-read", FAILED, t, stream=stream, first=next_offset, error=_describe(exc))
        if batch:
            actor.history.record("stream-read", OK, t, stream=stream, first=next_offset, entries=batch)
            next_offset = batch[-1][0] + 1
        actor.publish_status()
        if len(batch) < READ_BATCH:
            actor.pause(0.5)


def run_janitor(actor: Actor) -> None:
    """Recovers ledgers whose writer is gone, and those of writers the nemesis asked it to take over from."""
    requests = actor.dir / "requests"
    closed: set[int] = set()
    retry = Retry(deadline=30.0)
    while not actor.stopping():
        client = actor.client or actor.connect()
        if client is None:
            return
        takeovers = set()
        for request in sorted(requests.glob("*.json")):
            takeovers.add(json.loads(request.read_text())["writer_id"])
            request.unlink()
        t = time.time()
        try:
            candidates = sorted(set(client.list_ledgers()) - closed)
        except LedgerError as exc:
            actor.history.record("list", FAILED, t, error=_describe(exc))
            actor.pause(1.0)
            continue
        for ledger_id in candidates:
            if actor.stopping():
                break
            t = time.time()
            try:
                meta = client.ledger_metadata(ledger_id)
                if meta.is_closed:
                    closed.add(ledger_id)
                    continue
                why = "takeover" if meta.writer_id in takeovers else "dangling" if client.is_dangling(meta) else ""
                if not why:
                    continue
                recovered = client.recover_ledger_with_retry(ledger_id, retry=retry)
            except NoSuchLedgerError:
                closed.add(ledger_id)
                continue
            except LedgerError as exc:
                actor.history.record("recover", UNKNOWN, t, ledger=ledger_id, error=_describe(exc))
                continue
            closed.add(ledger_id)
            actor.history.record("recover", OK, t, ledger=ledger_id, why=why, last_entry=recovered.last_entry_id)
        actor.publish_status()
        actor.pause(2.0)


def run_auditor(actor: Actor) -> None:
    """`ledger audit --watch --lost-after LOST_AFTER`: moves the fragments of a node away for longer (killed, or
    paused past its ZooKeeper session) to other nodes, so that the node, once back, holds copies its metadata no
    longer names, which its garbage collection drops (over-replicated ledgers: a repair racing that drop must never
    leave the metadata naming a node without the entries, which the checker's copy comparison would find)."""
    from connector.client.replication import AuditSchedule
    from connector.client.rereplicate import Rereplicator
    from connector.commands.replication import watch

    while not actor.stopping():
        client = actor.client or actor.connect()
        if client is None:
            return
        t = time.time()
        try:
            with Rereplicator(client, lost_after=LOST_AFTER) as worker:
                schedule = AuditSchedule(full_seconds=AUDIT_FULL_SECONDS)
                while not actor.stopping():
                    t = time.time()
                    status = watch(worker, 0.0, schedule, rounds=1)
                    actor.history.record("audit", OK if status == 0 else FAILED, t)
                    actor.pause(1.0)
        except LedgerError as exc:
            actor.history.record("audit", FAILED, t, error=_describe(exc))
            actor.abandon_client()
            actor.pause(1.0)


ROLES = {
    "ledger-writer": run_ledger_writer,
    "stream-writer": run_stream_writer,
    "ledger-reader": run_ledger_reader,
    "stream-reader": run_stream_reader,
    "janitor": run_janitor,
    "auditor": run_auditor,
    "spark": spark_actor.run_spark,
}


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m connector.soak.workload", description="one actor of `ledger soak`")
    p.add_argument("role", choices=sorted(ROLES))
    p.add_argument("--actor", required=True, help="this actor's name (its history file is DIR/NAME.jsonl)")
    p.add_argument("--metadata", required=True, help="zk://host:port/root of the soak's cluster")
    p.add_argument("--dir", required=True, help="directory of the actors' histories and status files")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--until", type=float, required=True, help="time.time() at which to stop at the latest")
    p.add_argument("--node-addresses", default="{}", help="JSON: node id -> proxy address this actor dials")
    p.add_argument("--stream", default="soak", help="the stream of stream writers and readers")
    p.add_argument("--quorum", default="3,3,2", help="E,WQ,AQ of a ledger writer's ledgers")
    p.add_argument("--rate", type=float, default=30.0, help="appends per second")
    p.add_argument("--window", type=int, default=8, help="appends in flight")
    p.add_argument("--own", action="store_true", help="a stream writer that takes the stream over at start")
    p.add_argument("--spark-stream", default=spark_actor.SPARK_STREAM, help="the stream the spark actor writes")
    p.add_argument("--checkpoint", help="the spark actor's streaming checkpoint directory")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("kazoo.client").setLevel(logging.ERROR)  # a reconnect loop per ZooKeeper restart
    actor = Actor(args)
    try:
        ROLES[args.role](actor)
    finally:
        actor.history.close()
        if actor.client is not None:
            actor.client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
