"""`ledger audit` and `ledger decommission`: find under-replicated ledgers, re-replicate them, retire a node.

The password options exist because ledger metadata keeps only a password hash while the nodes need the master
key: ledgers whose password is not among those given are reported and left as they are.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Callable

from connector.client import LedgerError
from connector.client.replication import AuditSchedule
from connector.client.rereplicate import LedgerAudit, LedgerRepair, Rereplicator
from connector.commands import node_security
from connector.commands.arguments import (add_metadata, default_passwords, interval, password, seconds,
                                          seconds_or_zero)
from connector.commands.command_client import open_client
from metadata import registry

FULL_SCAN_SECONDS = 3600.0   # the auditor reads every ledger at least this often, nodes changed or not
LOST_AFTER_SECONDS = 60.0    # the auditor counts an unregistered node gone after this long (a restart is not)


def register(subparsers) -> None:
    def command(name: str, help: str, func):
        sub = subparsers.add_parser(name, help=help)
        add_metadata(sub)
        node_security.add_arguments(sub)
        sub.add_argument("--password", dest="passwords", type=password, action="append",
                         help="password of the ledgers to re-replicate; repeat for several (default: "
                              "$LEDGER_PASSWORD, else empty)")
        sub.set_defaults(func=func)
        return sub

    audit = command("audit", "list ledgers with a fragment on a gone or decommissioned node; --repair fixes them",
                    run_audit)
    audit.add_argument("--repair", action="store_true", help="re-replicate the under-replicated ledgers found")
    audit.add_argument("--watch", type=interval, metavar="SECONDS",
                       help="run as the auditor: audit and repair every SECONDS until interrupted")
    audit.add_argument("--once", action="store_true", help="with --watch: run a single auditor round and exit")
    audit.add_argument("--full-every", type=seconds, default=FULL_SCAN_SECONDS, metavar="SECONDS",
                       help="with --watch: a round reads every ledger's metadata only when the nodes changed since "
                            "the last scan (gone, back, restarted or decommissioned), or once this long has passed "
                            f"(default {FULL_SCAN_SECONDS:g}); a ledger a repair left is looked at alone each round")
    audit.add_argument("--lost-after", type=seconds_or_zero, default=LOST_AFTER_SECONDS, metavar="SECONDS",
                       help="with --watch: a node that is not registered counts as gone once it has been away this "
                            f"long (default {LOST_AFTER_SECONDS:g}): a restart costs no copies. Broken and "
                            "decommissioned nodes count at once; `ledger audit` without --watch counts every "
                            "unregistered node at once")
    audit.add_argument("--json", action="store_true",
                       help="one JSON object per under-replicated ledger (and per repair), then one summary")
    decommission = command("decommission", "copy every fragment on a node to other nodes, then retire it",
                           run_decommission)
    decommission.add_argument("node_id")


def _passwords(args) -> list[bytes]:
    return default_passwords(args.passwords)


def run_audit(args) -> int:
    lost_after = args.lost_after if args.watch is not None else 0.0
    with open_client(args) as client, Rereplicator(client, _passwords(args), lost_after=lost_after) as worker:
        if args.watch is None:   # exit status 1 while anything is left under-replicated, deferred ledgers too
            return 1 if _audit_round(worker, args.repair, args.json) or worker.pending else 0
        # The auditor: repairs on its own, until interrupted (Ctrl-C ends it via KeyboardInterrupt).
        return watch(worker, args.watch, AuditSchedule(args.full_every), rounds=1 if args.once else None,
                     as_json=args.json)


def watch(worker: Rereplicator, interval: float, schedule: AuditSchedule, rounds: int | None = None,
          as_json: bool = False) -> int:
    """The auditor's rounds, every `interval` seconds (`rounds` of them, or until interrupted); each scans and
    repairs when the schedule says so. The status of the last round."""
    status = 0
    while rounds is None or rounds > 0:
        try:
            nodes, now = worker.nodes_now(), time.monotonic()
            reason = schedule.reason(nodes, now)
            if reason is None:
                print(f"audit skipped: no node gone, back, restarted or decommissioned since the last scan (every "
                      f"ledger is read again in {schedule.next_full_scan(now):.0f}s)")
                if worker.pending:   # a read of each, not a scan; logged once repaired or failed
                    report = _reporter(as_json)
                    outcomes = worker.repair_deferred(
                        lambda outcome: None if outcome.deferred and not outcome.fragments else report(outcome))
                    status = 1 if any(not outcome.ok for outcome in outcomes) else 0
            else:
                failed = _audit_round(worker, repair=True, as_json=as_json, nodes=nodes)
                # Ledgers left to their live writers, or whose repair failed, are not work for another scan:
                # repair_deferred reads them alone in the next rounds.
                schedule.scanned(nodes, now)
                status = 1 if failed else 0
        except LedgerError as exc:  # ZooKeeper briefly away: the auditor outlives it and tries again
            print(f"audit round failed: {exc}; next round in {interval}s", file=sys.stderr, flush=True)
            status = 1
        sys.stdout.flush()  # an auditor's log is read while it runs
        if rounds is not None:
            rounds -= 1
            if not rounds:
                break
        time.sleep(interval)
    return status


def _audit_round(worker: Rereplicator, repair: bool, as_json: bool = False, nodes=None) -> int:
    """One audit (and repair): how many under-replicated ledgers it left, not counting those deferred to their
    live writers (worker.deferred)."""
    found = worker.audit(nodes)
    for audit in found:
        print(json.dumps(audit_json(audit)) if as_json else describe_audit(audit))
    if not found or not repair:
        if as_json:
            print(json.dumps({"under_replicated": len(found)}))
        elif found:
            print(f"{len(found)} under-replicated ledger(s); run `ledger audit --repair` to re-replicate them")
        else:
            print("no under-replicated ledgers")
        return len(found)

    outcomes = worker.repair(found, _reporter(as_json))
    failed = [o for o in outcomes if not o.ok]
    deferred = [o for o in outcomes if o.deferred]
    repaired = len(outcomes) - len(failed) - len(deferred)
    if as_json:
        print(json.dumps({"under_replicated": len(found), "repaired": repaired, "failed": len(failed),
                          "deferred": len(deferred)}))
    else:
        print(f"repaired {repaired} of {len(outcomes)} under-replicated ledger(s)" + (
            f"; {len(deferred)} left for now to their live writers (moved once closed)" if deferred else ""))
    return len(failed)


def _reporter(as_json: bool) -> Callable[[LedgerRepair], None]:
    """Prints each ledger's outcome as soon as it is known: an auditor stopped mid-round has logged its work."""
    def report(outcome: LedgerRepair) -> None:
        if as_json:
            print(json.dumps(dict(dataclasses.asdict(outcome), repaired=outcome.ok and not outcome.deferred)),
                  flush=True)
        else:
            _print_outcome(outcome)
    return report


def run_decommission(args) -> int:
    registry.check_node_id(args.node_id)
    with open_client(args) as client, Rereplicator(client, _passwords(args)) as worker:
        outcomes = worker.decommission(args.node_id, on_ledger=_print_outcome)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        print(f"node {args.node_id} still holds fragments of {len(failed)} ledger(s) "
              f"({', '.join(str(o.ledger_id) for o in failed)}); fix the causes above and run "
              f"`ledger decommission {args.node_id}` again. Keep the node and its data until then.")
        return 1
    print(f"node {args.node_id} is decommissioned: no ledger uses it ({len(outcomes)} ledger(s) moved); "
          "stop it and delete its data directory")
    return 0


def _print_outcome(outcome: LedgerRepair) -> None:
    print(outcome.describe(), flush=True)


def audit_json(audit: LedgerAudit) -> dict:
    return {
        "ledger_id": audit.meta.ledger_id, "state": audit.meta.state.value, "lost": dict(sorted(audit.reasons.items())),
        "fragments": [{"first_entry_id": r.first_entry_id, "last_entry_id": r.last_entry_id if r.closed else None,
                       "ensemble": list(r.ensemble), "lost": list(r.lost)} for r in audit.repairs],
    }


def describe_audit(audit: LedgerAudit) -> str:
    meta = audit.meta
    lost = ", ".join(f"{node} {why}" for node, why in sorted(audit.reasons.items()))
    fragments = "; ".join(repair.describe() for repair in audit.repairs)
    state = "" if meta.is_closed else (f" ({meta.state.value}: once its writer is gone, a repair recovers and closes "
                                       "it first; while the writer lives, it moves the older fragments and leaves "
                                       "the last one to the writer)")
    return f"ledger {meta.ledger_id}{state}: {lost}: {fragments}"
