"""The soak's checker: judges the merged history against what the cluster holds once every fault healed and
every ledger was recovered. It trusts nothing the actors concluded, only what they were told (acks, reads)
and what the store returns now.

Violations, by kind:
- lost: an acknowledged append that is not readable with its payload where it was acknowledged, by ledger
  read and, for a stream append, at its offset by stream read; an ack for an entry beyond the last entry its
  ledger was closed at (a writer acknowledged after it was fenced or closed, or a truncation) is one.
- duplicated: a stream offset held twice, a ledger in a stream twice, a payload at two offsets.
- divergent: an entry whose payload was sent as another ledger's or entry's, stream offsets that jump, a stream
  whose record of a ledger's offsets disagrees with the ledger's close, a stream read that disagrees with
  ledger reads, a reader that saw something the final ledger or stream does not hold there, and a close or
  recovery that returned another last entry than the ledger holds now.
- orphaned: a ledger that no stream and no writer owns (a stream writer's ledger the stream never got).
- unrecovered: a ledger still OPEN after the final recovery (judged up to its LAC).
- under-replicated: an entry of a closed ledger with fewer good copies on its write set than the ack quorum
  (replicas.py: every copy of every closed ledger is read from every node that should hold it, and copies that
  disagree are *divergent*; a copy missing while AQ or more are held is a figure, not a violation).
- crashed: an actor died of an exception (the client raised something outside its LedgerError hierarchy),
  exited with a status other than 0 after the final SIGTERM, or logged a traceback; the soak adds these.

An append recorded failed was refused before anything was sent (append_async raised: its handle or stream writer
was closed, or the entry too large; the pipeline's own errors come through the future and are recorded unknown);
one found in its ledger is *duplicated*: its caller, told it failed, would write it again.

With --spark (check_spark), the Spark actor's stream: its rate rows must be exactly the values its streaming
query's committed micro-batches produced, each once (compared with chispa; a value held twice is
duplicated, one missing is lost, one beyond the commits is divergent); a batch write acknowledged is there
exactly once (lost if not), one reported failed is not there (duplicated: a retry would write it twice), and
one whose outcome is unknown, or that the history never recorded (its driver was killed), is there whole
or not at all (lost if in part). Its ledgers take part in the orphan check like every other ledger.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import time
from typing import Callable, Iterable, Iterator

from connector.client import LedgerClient, LedgerError, Streams
from connector.client.retry import Retry
from connector.soak import replicas
from connector.soak.history import FAILED, OK, UNKNOWN, digest, parse_payload
from connector.soak.spark_actor import RATE, SparkOutput, tag_rows
from metadata import streams
from metadata.model import LedgerMetadata, StreamLedger

APPENDS = ("append", "stream-append")
WRITER_STEPS = ("create", "takeover", "roll")  # what a writer must do before it can append (and connect)
REFUSED = ("LedgerFencedError", "LedgerClosedError")  # a store that refuses a fenced writer is working
REPLICA_READ_SECONDS = 10.0  # the most one node's read of a ledger's copies waits for each message
MAX_RUNS = 20  # runs of entry ids a violation names at most


@dataclasses.dataclass(frozen=True)
class Violation:
    kind: str
    detail: str


@dataclasses.dataclass
class FinalState:
    """What the store holds at the end: every ledger's metadata and entry digests, and each stream's offsets."""

    ledgers: dict[int, LedgerMetadata]
    digests: dict[int, list[str]]
    stream_ledgers: dict[str, list[StreamLedger]]
    stream_offsets: dict[str, dict[int, tuple[int, int, str]]]  # offset -> (ledger, entry, digest)
    violations: list[Violation]
    replicas: replicas.ReplicaFigures = dataclasses.field(default_factory=replicas.ReplicaFigures)

    @classmethod
    def read(cls, client: LedgerClient, stream_names: Iterable[str], arrow_streams: Iterable[str] = ()) -> "FinalState":
        """Every ledger read by ledger reads (an OPEN one up to its LAC), every stream by stream reads. The
        ledgers of arrow_streams (Spark's rows, judged by check_spark) only by their metadata. Every closed
        ledger's copies, Spark's too, node by node (replicas.py)."""
        from connector.client.runner import Context, Runtime

        state = cls({}, {}, {}, {}, [])
        arrow_streams = set(arrow_streams)
        runtime = Runtime.shared()
        ctx = Context(client.store, client.transport(), REPLICA_READ_SECONDS, REPLICA_READ_SECONDS)
        try:
            for ledger_id in sorted(client.list_ledgers()):
                try:
                    handle = client.open_ledger(ledger_id, recover=False)
                    meta = handle.metadata
                    if meta.custom.get("stream") in arrow_streams:
                        state.add_ledger(meta, None)
                    else:
                        entries = handle.read(0, handle.last_entry_id) if handle.last_entry_id >= 0 else ()
                        state.add_ledger(meta, [entry.payload for entry in entries])
                    if meta.is_closed:
                        state.add_copies(meta, runtime.run(replicas.read_copies(ctx, meta)))
                except LedgerError as exc:  # with every fault healed, what cannot be read is not there
                    state.violations.append(Violation("lost", f"ledger {ledger_id} cannot be read: {exc}"))
        finally:
            runtime.run(ctx.transport.close())
        for name in arrow_streams:
            found = streams.find_stream(client.store, name)
            state.add_arrow_stream(name, stream_ledgers(client.store, found.value) if found is not None else [])
        for name in stream_names:
            found = streams.find_stream(client.store, name)
            held = stream_ledgers(client.store, found.value) if found is not None else []
            try:
                read = [(e.offset, e.ledger_id, e.entry_id, digest(e.payload))
                        for e in (Streams(client).read(name) if found is not None else ())]
            except LedgerError as exc:
                state.violations.append(Violation("lost", f"stream {name!r} cannot be read: {exc}"))
                read = []
            state.add_stream(name, held, read)
        return state

    def add_ledger(self, meta: LedgerMetadata, payloads: Iterable[bytes] | None) -> None:
        """A ledger and its entries from 0 on: each must hold the payload sent as that entry of that ledger
        (payloads None: a ledger of Arrow rows, not judged here)."""
        ledger_id = meta.ledger_id
        self.ledgers[ledger_id] = meta
        if not meta.is_closed:
            self.violations.append(Violation("unrecovered", f"ledger {ledger_id} is still {meta.state.name} after "
                                                            "the final recovery; judged up to its LAC"))
        if payloads is None:
            return
        digests = []
        for entry_id, data in enumerate(payloads):
            digests.append(digest(data))
            sent_as = parse_payload(data)
            if sent_as is None or sent_as[1:] != (ledger_id, entry_id):
                self.violations.append(Violation("divergent", f"ledger {ledger_id} entry {entry_id} holds "
                                                              f"{_sent_as(sent_as)}"))
        if meta.is_closed and len(digests) != meta.last_entry_id + 1:   # a read that came back short, not raising
            self.violations.append(Violation("lost", f"ledger {ledger_id} is closed at entry {meta.last_entry_id} "
                                                     f"but {len(digests)} entries were read from it"))
        self.digests[ledger_id] = digests

    def add_copies(self, meta: LedgerMetadata, found: dict[str, replicas.NodeCopies]) -> None:
        """A closed ledger's copies as replicas.read_copies found them on each node: damaged or disagreeing
        copies are *divergent*, an entry with fewer good copies on its write set than AQ *under-replicated*;
        the rest goes into the figures."""
        verdict = replicas.judge(meta, found)
        self.replicas.add(verdict.figures)
        where = f"ledger {meta.ledger_id}"
        for entry_id, node, problem in verdict.damaged:
            self.violations.append(Violation("divergent", f"{where} entry {entry_id}: the copy on {node} is damaged "
                                                          f"({problem})"))
        for entry_id, held in verdict.differing:
            copies = ", ".join(f"{node} {payload}" for node, payload in sorted(held.items()))
            self.violations.append(Violation("divergent", f"{where} entry {entry_id}: its copies hold different "
                                                          f"payloads (by node, their hashes: {copies})"))
        if verdict.below_quorum:
            why = ", ".join(f"{node} {reason}" for node, reason in sorted(verdict.lacking.items()))
            self.violations.append(Violation(
                "under-replicated", f"{where} (E={meta.ensemble_size} WQ={meta.write_quorum} AQ={meta.ack_quorum}): "
                                    f"{len(verdict.below_quorum)} entries with fewer good copies on their write "
                                    f"sets than AQ, entries {_runs(verdict.below_quorum)} ({why})"))

    def add_arrow_stream(self, name: str, held: list[StreamLedger]) -> None:
        """A Spark stream's ledgers: each once, each there, their row offsets contiguous (rows themselves are
        check_spark's)."""
        self.stream_ledgers[name] = held
        for sl, where in self._held_in_order(name, held, _listed_end):
            if sl.ledger_id not in self.ledgers:
                self.violations.append(Violation("lost", f"{where}, which is gone"))

    def _held_in_order(self, name: str, held: list[StreamLedger],
                       end: Callable[[StreamLedger], int | None]) -> Iterator[tuple[StreamLedger, str]]:
        """The stream's ledgers, each held once (a second time is *duplicated*), each starting where the one
        before ended (`end`: its last offset, None when it cannot be told); yields each with its description."""
        seen: set[int] = set()
        next_offset = held[0].first_offset if held else 0
        for sl in held:
            where = f"stream {name!r} holds ledger {sl.ledger_id}"
            if sl.ledger_id in seen:
                self.violations.append(Violation("duplicated", f"{where} twice"))
                continue
            seen.add(sl.ledger_id)
            if sl.first_offset != next_offset:
                kind = "duplicated" if sl.first_offset < next_offset else "divergent"
                self.violations.append(Violation(kind, f"{where} from offset {sl.first_offset}, the ledger before "
                                                       f"it ends at offset {next_offset - 1}"))
            yield sl, where
            last = end(sl)
            if last is not None:
                next_offset = last + 1

    def _last_entry(self, ledger_id: int) -> int | None:
        """The ledger's last entry: where it closed, or the last one found in it; None if it is gone."""
        meta = self.ledgers.get(ledger_id)
        if meta is None:
            return None
        return meta.last_entry_id if meta.is_closed else len(self.digests[ledger_id]) - 1

    def add_stream(self, name: str, held: list[StreamLedger], read: Iterable[tuple[int, int, int, str]]) -> None:
        """A stream's ledgers as its metadata lists them (after add_ledger of each), and what a stream read
        returned: (offset, ledger, entry, digest) in the order it came."""
        self.stream_ledgers[name] = held
        expected: dict[int, tuple[int, int, str]] = {}

        def end(sl: StreamLedger) -> int | None:   # a raw ledger's offsets are its entries
            last = self._last_entry(sl.ledger_id)
            return None if last is None else sl.first_offset + last

        for sl, where in self._held_in_order(name, held, end):
            last = self._last_entry(sl.ledger_id)
            if last is None:
                self.violations.append(Violation("lost", f"{where}, which is gone"))
                continue
            if sl.last_offset is not None and sl.last_offset - sl.first_offset != last:
                self.violations.append(Violation("divergent", f"{where} as offsets {sl.first_offset}.."
                                                              f"{sl.last_offset}, the ledger closed at entry {last}"))
            for entry_id, entry_digest in enumerate(self.digests[sl.ledger_id][:last + 1]):
                expected[sl.first_offset + entry_id] = (sl.ledger_id, entry_id, entry_digest)
        self.stream_offsets[name] = expected
        by_offset: dict[int, tuple[int, int, str]] = {}
        for offset, ledger_id, entry_id, entry_digest in read:
            if offset in by_offset:
                self.violations.append(Violation("duplicated", f"stream {name!r}: a stream read returned offset "
                                                               f"{offset} twice"))
            by_offset[offset] = (ledger_id, entry_id, entry_digest)
        for offset in sorted(set(by_offset) | set(expected)):
            if by_offset.get(offset) != expected.get(offset):
                self.violations.append(Violation("divergent", f"stream {name!r} offset {offset}: a stream read "
                                                              f"gives {by_offset.get(offset)}, the ledgers "
                                                              f"{expected.get(offset)}"))


def _listed_end(sl: StreamLedger) -> int:
    """Where a ledger ends as the stream lists it (an OPEN tail: at its first offset)."""
    return sl.last_offset if sl.last_offset is not None else sl.first_offset


def stream_ledgers(store, record) -> list[StreamLedger]:
    """Every ledger of the stream in offset order (sealed pages and the tail)."""
    return list(streams.iter_ledgers(store, record))


def _sent_as(sent_as: tuple[str, int, int] | None) -> str:
    if sent_as is None:
        return "a payload the soak never sent (damaged?)"
    return f"the payload {sent_as[0]} sent as ledger {sent_as[1]} entry {sent_as[2]}"


@dataclasses.dataclass
class Report:
    ops: int = 0
    outcomes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    faults: collections.Counter = dataclasses.field(default_factory=collections.Counter)       # took effect
    not_applied: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # could not be
    not_healed: collections.Counter = dataclasses.field(default_factory=collections.Counter)   # heal gave up
    violations: list[Violation] = dataclasses.field(default_factory=list)
    # while at most one node was faulty: appends invoked (but those a fenced or closed ledger refused), and the
    # attempts of writers that failed before an append could be sent (connect, create, takeover, roll)
    attempted_available: int = 0
    acked_available: int = 0
    blocked_available: int = 0       # those failed attempts (also in attempted_available)
    blocked_seconds: float = 0.0     # from each to its writer's next operation
    p99_append_ms: float = 0.0       # acknowledged appends, invoke to ack
    p99_any_append_ms: float = 0.0   # every append, acknowledged, failed or unknown: invoke to outcome
    unknown_landed: int = 0
    unknown_appends: int = 0
    replicas: replicas.ReplicaFigures = dataclasses.field(default_factory=replicas.ReplicaFigures)
    spark: "SparkSummary | None" = None

    def count(self, kind: str) -> int:
        return sum(1 for v in self.violations if v.kind == kind)

    @property
    def ok(self) -> bool:
        return not self.violations

    def line(self, minutes: float, seed: int) -> str:
        faults = _by_kind(self.faults)
        for label, counter in (("not applied", self.not_applied), ("not healed", self.not_healed)):
            if counter:
                faults += f"; {label} {sum(counter.values())}: {_by_kind(counter)}"
        availability = self.acked_available / self.attempted_available if self.attempted_available else 1.0
        others = "".join(f", {kind} {self.count(kind)}" for kind in ("under-replicated", "unrecovered", "crashed")
                         if self.count(kind))
        return (f"soak: {minutes:g} minutes, seed {seed}, ops {self.ops} (acked {self.outcomes[OK]}, failed "
                f"{self.outcomes[FAILED]}, unknown {self.outcomes[UNKNOWN]}), faults {sum(self.faults.values())} "
                f"by kind ({faults}), lost {self.count('lost')}, duplicated {self.count('duplicated')}, divergent "
                f"{self.count('divergent')}, orphaned {self.count('orphaned')}{others}"
                + (f"; {self.spark.line()}" if self.spark is not None else "")
                + f"; append availability {availability:.2%} ({self.acked_available}/{self.attempted_available} "
                f"while at most one node was faulty: appends acked / appends invoked + {self.blocked_available} "
                f"failed connects, creates, takeovers and rolls of writers, {self.blocked_seconds:.0f} s till each "
                f"writer's next try), p99 append latency {self.p99_append_ms:.0f} ms acked, "
                f"{self.p99_any_append_ms:.0f} ms every append (acked, failed or unknown: invoke to outcome); "
                f"{self.replicas.line()}")


def _by_kind(counter: collections.Counter) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in sorted(counter.items()))


def check(final: FinalState, history: list[dict], faults: list[dict]) -> Report:
    """faults: the nemesis's records (Nemesis.records: {"fault", "t", "t_end", "nodes", ...}), one per fault
    it injected: t_end None if it never ended, "applied" false if it could not be applied, "healed" false if
    its heal gave up."""
    report = Report(violations=list(final.violations), replicas=final.replicas)
    report.ops = len(history)
    report.outcomes.update(r["outcome"] for r in history)
    for f in faults:
        if f.get("applied", True):
            report.faults[f["fault"]] += 1
            if f.get("t_end") is None or f.get("healed") is False:
                report.not_healed[f["fault"]] += 1
        else:
            report.not_applied[f["fault"]] += 1
    for record in history:
        if record["op"] in APPENDS:
            _check_append(final, record, report)
        elif record["op"] == "read" and record["outcome"] == OK:
            _check_ledger_read(final, record, report)
        elif record["op"] == "stream-read" and record["outcome"] == OK:
            _check_stream_read(final, record, report)
        elif record["op"] in ("close", "recover") and record["outcome"] == OK:
            _check_close(final, record, report)
    _check_owners(final, report)
    _availability(history, [f for f in faults if f.get("applied", True)], report)
    return report


def _check_append(final: FinalState, r: dict, report: Report) -> None:
    ledger_id, entry_id = r["ledger"], r["entry"]
    digests = final.digests.get(ledger_id)
    meta = final.ledgers.get(ledger_id)
    held = digests is not None and entry_id < len(digests) and digests[entry_id] == r.get("digest")
    if r["outcome"] == UNKNOWN:
        report.unknown_appends += 1
        report.unknown_landed += held
        return
    if r["outcome"] == FAILED and held:
        report.violations.append(Violation("duplicated", f"{r['actor']}'s {r['op']} of ledger {ledger_id} entry "
                                                         f"{entry_id} failed ({r.get('error')}), and the ledger holds "
                                                         "it: its caller, told it failed, would write it again"))
    if r["outcome"] != OK:
        return
    where = f"{r['actor']}'s {r['op']} of ledger {ledger_id} entry {entry_id} (acked at {r['t_end']:.3f})"
    if r["op"] == "append" and r.get("acked_entry") != entry_id:
        report.violations.append(Violation("divergent", f"{where} was acknowledged as entry {r.get('acked_entry')}"))
    if meta is None:
        report.violations.append(Violation("lost", f"{where}: the ledger is gone"))
    elif meta.is_closed and entry_id > meta.last_entry_id:
        report.violations.append(Violation("lost", f"{where}: the ledger was closed at entry {meta.last_entry_id}: "
                                                   "acknowledged after its ledger was fenced or closed, or truncated"))
    elif not held:
        report.violations.append(Violation("lost", f"{where}: the ledger holds another payload there"))
    if r["op"] == "stream-append":
        at = final.stream_offsets.get(r["stream"], {}).get(r["offset"])
        if at != (ledger_id, entry_id, r["digest"]):
            report.violations.append(Violation("lost", f"{where} at stream offset {r['offset']}: the stream holds "
                                                       f"{at} there"))


def _check_close(final: FinalState, r: dict, report: Report) -> None:
    """Every close and recovery that returned agrees with the ledger's final close."""
    meta = final.ledgers.get(r["ledger"])
    if meta is None or meta.last_entry_id != r["last_entry"]:
        now = "is gone" if meta is None else f"closed at entry {meta.last_entry_id}"
        report.violations.append(Violation("divergent", f"{r['actor']}'s {r['op']} of ledger {r['ledger']} returned "
                                                        f"last entry {r['last_entry']}, the ledger {now}"))


def _check_ledger_read(final: FinalState, r: dict, report: Report) -> None:
    ledger_id = r["ledger"]
    digests = final.digests.get(ledger_id, [])
    for i, seen in enumerate(r["digests"]):
        entry_id = r["first"] + i
        now = digests[entry_id] if entry_id < len(digests) else None
        if now != seen:
            report.violations.append(Violation("divergent", f"{r['actor']} read ledger {ledger_id} entry {entry_id} "
                                                            f"at {r['t']:.3f} as {seen}, it now holds {now}"))
            return


def _check_stream_read(final: FinalState, r: dict, report: Report) -> None:
    offsets = final.stream_offsets.get(r["stream"], {})
    expected = r["first"]
    for offset, ledger_id, entry_id, seen in r["entries"]:
        if offset != expected:
            report.violations.append(Violation("divergent", f"{r['actor']}'s stream read at {r['t']:.3f} went from "
                                                            f"offset {expected - 1} to {offset}"))
        if offsets.get(offset) != (ledger_id, entry_id, seen):
            report.violations.append(Violation("divergent", f"{r['actor']} read stream offset {offset} at "
                                                            f"{r['t']:.3f} as {(ledger_id, entry_id, seen)}, it now "
                                                            f"holds {offsets.get(offset)}"))
            return
        expected = offset + 1


def _check_owners(final: FinalState, report: Report) -> None:
    in_streams = {sl.ledger_id: name for name, held in final.stream_ledgers.items() for sl in held}
    for ledger_id, meta in final.ledgers.items():
        tags = dict(meta.custom_metadata)
        if ledger_id in in_streams or tags.get("soak_role") == "ledger":
            continue
        owner = f"stream {tags['stream']!r} (owner {_made_by(tags)})" if "stream" in tags else "nobody"
        report.violations.append(Violation("orphaned", f"ledger {ledger_id} ({meta.state.name}, last entry "
                                                       f"{meta.last_entry_id}) was made for {owner} and is in no "
                                                       "stream"))


def _made_by(tags: dict[str, str]) -> str | None:
    """Who made a stream's ledger: a stream writer, a Spark write job's task, a streaming query's micro-batch."""
    if "spark.job" in tags:
        return f"Spark write job {tags['spark.job']} task {tags.get('spark.task')}"
    if "spark.query" in tags:
        return f"Spark {tags['spark.query']} micro-batch {tags.get('spark.batch')} task {tags.get('spark.task')}"
    return tags.get("stream_owner")


def _availability(history: list[dict], faults: list[dict], report: Report) -> None:
    """Attempts to append while at most one node was faulty (kills, pauses, full disks, proxy faults): the
    appends invoked, without those a fenced or closed ledger refused, and the attempts that failed before an
    append could be sent (a writer's connect, create, takeover or roll: blocked); and the p99 latencies."""
    spans = sorted((f["t"], math.inf if f.get("t_end") is None else f["t_end"], tuple(f.get("nodes", ())))
                   for f in faults if f.get("nodes"))
    acked, every = [], []
    active: list[tuple[float, float, tuple]] = []
    next_span = 0
    blocked_since: dict[str, dict] = {}   # actor -> its failed attempt (one that counted) till its next record
    for r in history:  # in invocation order
        since = blocked_since.pop(r["actor"], None)
        if since is not None:
            report.blocked_seconds += r["t"] - since["t"]
        blocked = _blocked(r)
        if r["op"] in APPENDS:
            every.append(r["t_end"] - r["t"])
            if r["outcome"] == OK:
                acked.append(r["t_end"] - r["t"])
        elif not blocked:
            continue
        if r["outcome"] != OK and r.get("error", "").startswith(REFUSED):
            continue
        while next_span < len(spans) and spans[next_span][0] <= r["t"]:
            active.append(spans[next_span])
            next_span += 1
        active = [s for s in active if s[1] >= r["t"]]
        if len({node for s in active for node in s[2]}) <= 1:
            report.attempted_available += 1
            report.acked_available += r["outcome"] == OK
            if blocked:
                report.blocked_available += 1
                blocked_since[r["actor"]] = r
    report.blocked_seconds += sum(r["t_end"] - r["t"] for r in blocked_since.values())   # an actor's last record
    report.p99_append_ms = _p99(acked)
    report.p99_any_append_ms = _p99(every)


def _blocked(r: dict) -> bool:
    """A writer's attempt that failed before it could append: a create, takeover or roll, or the connect of a
    writer that is writing (not an idle stream writer's)."""
    if r["outcome"] == OK:
        return False
    return r["op"] in WRITER_STEPS or (r["op"] == "connect" and bool(r.get("writing")))


def _p99(latencies: list[float]) -> float:
    """In ms; 0 for none."""
    if not latencies:
        return 0.0
    latencies.sort()
    return 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]


def recover_all(client: LedgerClient, seconds: float) -> list[str]:
    """Close every ledger still OPEN (rules 10-12), retrying for `seconds` in all; why those that would not
    close did not (FinalState reports them as unrecovered)."""
    errors = []
    deadline = time.monotonic() + seconds
    for ledger_id in sorted(client.list_ledgers()):
        try:
            if not client.ledger_metadata(ledger_id).is_closed:
                retry = Retry(deadline=max(1.0, deadline - time.monotonic()))
                client.recover_ledger_with_retry(ledger_id, retry=retry)
        except LedgerError as exc:
            errors.append(f"ledger {ledger_id}: {type(exc).__name__}: {exc}")
    return errors


# -- --spark ---------------------------------------------------------------------------------------------------

MAX_REPORTED_VALUES = 100_000  # rate values a diagnosis collects at most (each kind)


@dataclasses.dataclass
class SparkSummary:
    rows: int          # rows in the Spark stream
    batches: int       # batch writes acknowledged
    restarts: int      # starts of the streaming query after its first (a killed driver, a failed query)

    def line(self) -> str:
        return f"spark rows {self.rows} (batches {self.batches}, query restarts {self.restarts})"


def check_spark(output: SparkOutput, history: list[dict]) -> tuple[list[Violation], SparkSummary]:
    """The Spark stream against the history: the streaming query's rate rows exactly once, every batch write
    whole or absent as its outcome says (see the module docstring)."""
    from pyspark.sql import functions as F

    violations = _check_rate(output)
    batches = {r["tag"]: r for r in history if r["op"] == "spark-batch"}
    found = (output.rows.filter(F.col("source") != RATE).groupBy("source")
             .agg(F.count("*").alias("n"), F.countDistinct("value").alias("distinct"),
                  F.min("value").alias("low"), F.max("value").alias("high")).collect())
    held = {row["source"]: row for row in found}
    for tag in sorted(set(batches) | set(held)):
        violations += _check_batch(tag, batches.get(tag), held.get(tag))
    summary = SparkSummary(
        rows=output.rows.count(),
        batches=sum(1 for r in batches.values() if r["outcome"] == OK),
        restarts=sum(1 for r in history if r["op"] == "query-start" and r["outcome"] == OK and r["run"] == "restart"),
    )
    return violations, summary


def _check_rate(output: SparkOutput) -> list[Violation]:
    """chispa decides whether the rate rows are exactly 0..committed_end-1; if not, name what differs."""
    from chispa import DataFramesNotEqualError, assert_df_equality
    from pyspark.sql import functions as F

    violations = []
    if output.spark_committed_end > output.committed_end:
        violations.append(Violation("lost", f"Spark's commit log has the streaming query's rows up to rate value "
                                            f"{output.spark_committed_end - 1}, the sink's commit record only up "
                                            f"to {output.committed_end - 1}"))
    rate = output.rows.filter(F.col("source") == RATE).select("value")
    expected = output.rows.sparkSession.range(0, output.committed_end).select(F.col("id").alias("value"))
    try:
        assert_df_equality(rate, expected, ignore_row_order=True, ignore_nullable=True)
        return violations
    except DataFramesNotEqualError:
        pass
    where = "the streaming query's output"
    twice = (rate.groupBy("value").count().filter(F.col("count") > 1).orderBy("value")
             .limit(MAX_REPORTED_VALUES).collect())
    for low, high in _ranges([row["value"] for row in twice]):
        violations.append(Violation("duplicated", f"{where} holds rate values {_span(low, high)} more than once"))
    missing = expected.join(rate, "value", "left_anti").orderBy("value").limit(MAX_REPORTED_VALUES).collect()
    for low, high in _ranges([row["value"] for row in missing]):
        violations.append(Violation("lost", f"{where} lacks rate values {_span(low, high)} (its commits end at "
                                            f"{output.committed_end - 1})"))
    beyond = rate.filter((F.col("value") >= output.committed_end) | (F.col("value") < 0)) \
        .agg(F.count("*").alias("n"), F.min("value").alias("low"), F.max("value").alias("high")).first()
    if beyond["n"]:
        violations.append(Violation("divergent", f"{where} holds {beyond['n']} rows of rate values "
                                                 f"{_span(beyond['low'], beyond['high'])}, beyond its committed "
                                                 f"batches' end {output.committed_end - 1}"))
    if not violations:
        violations.append(Violation("divergent", f"{where} differs from rate values 0..{output.committed_end - 1} "
                                                 "(chispa), and no value is missing, twice or beyond"))
    return violations


def _check_batch(tag: str, written: dict | None, held) -> list[Violation]:
    """One batch write: written is its history record (None: never recorded), held its rows' aggregate."""
    rows = tag_rows(tag)
    outcome = written["outcome"] if written is not None else UNKNOWN
    what = f"batch write {tag} ({outcome if written is not None else 'not in the history: its driver died'})"
    if rows is None:
        return [Violation("divergent", f"the Spark stream holds {held['n']} rows of source {tag!r}, which no "
                                       "writer of the soak wrote")]
    if held is None:
        return [Violation("lost", f"{what} is not in the stream")] if outcome == OK else []
    found = f"{held['n']} rows of values {held['low']}..{held['high']} ({held['distinct']} distinct)"
    if held["n"] > held["distinct"]:
        return [Violation("duplicated", f"{what}: the stream holds {found}, of {rows} written")]
    if (held["distinct"], held["low"], held["high"]) != (rows, 0, rows - 1):
        return [Violation("lost", f"{what}: the stream holds {found}, part of the {rows} written")]
    if outcome == FAILED:
        return [Violation("duplicated", f"{what} is in the stream: reported failed, a retry would write it twice")]
    return []


def _ranges(values: list[int]) -> list[tuple[int, int]]:
    """Sorted values as runs of consecutive ones: [1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    runs: list[list[int]] = []
    for value in values:
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    return [(low, high) for low, high in runs]


def _span(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}..{high}"


def _runs(values: list[int]) -> str:
    """Sorted values as their runs, the first MAX_RUNS of them: 3..7, 9 and 2 more runs."""
    runs = _ranges(values)
    shown = ", ".join(_span(low, high) for low, high in runs[:MAX_RUNS])
    return shown + (f" and {len(runs) - MAX_RUNS} more runs" if len(runs) > MAX_RUNS else "")
