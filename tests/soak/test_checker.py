"""The soak's checker fed by hand: a clean history passes, and each kind of violation is found and named."""
from __future__ import annotations

from connector.soak.checker import FinalState, check
from connector.soak.history import OK, UNKNOWN, digest, parse_payload, payload
from metadata.model import Fragment, LedgerMetadata, LedgerState, StreamLedger

NODES = ("node-1", "node-2", "node-3")


def ledger(ledger_id: int, last_entry_id: int, closed: bool = True, **tags) -> LedgerMetadata:
    return LedgerMetadata(ledger_id, 3, 3, 2, (Fragment(0, NODES),),
                          state=LedgerState.CLOSED if closed else LedgerState.OPEN, last_entry_id=last_entry_id,
                          custom_metadata=tuple(sorted(tags.items())))


def entries(actor: str, ledger_id: int, count: int) -> list[bytes]:
    return [payload(actor, ledger_id, e, 100) for e in range(count)]


def append(actor: str, ledger_id: int, entry_id: int, outcome: str = OK, t: float = 10.0, **fields) -> dict:
    data = payload(actor, ledger_id, entry_id, 100)
    record = {"t": t + entry_id / 100, "t_end": t + entry_id / 100 + 0.01, "actor": actor, "op": "append",
              "outcome": outcome, "ledger": ledger_id, "entry": entry_id, "digest": digest(data)}
    if outcome == OK:
        record["acked_entry"] = entry_id
    return {**record, **fields}


def stream_append(actor: str, ledger_id: int, entry_id: int, offset: int) -> dict:
    return {**append(actor, ledger_id, entry_id), "op": "stream-append", "stream": "s", "offset": offset}


def state_with_stream() -> FinalState:
    """A plain ledger 1 (5 entries), and stream 's' of ledgers 2 (offsets 0..2) and 3 (offsets 3..4)."""
    final = FinalState({}, {}, {}, {}, [])
    final.add_ledger(ledger(1, 4, soak_role="ledger"), entries("lw", 1, 5))
    final.add_ledger(ledger(2, 2, stream="s"), entries("sw", 2, 3))
    final.add_ledger(ledger(3, 1, stream="s"), entries("sw", 3, 2))
    read = [(o, lid, e, digest(payload("sw", lid, e, 100))) for o, lid, e in ((0, 2, 0), (1, 2, 1), (2, 2, 2),
                                                                              (3, 3, 0), (4, 3, 1))]
    final.add_stream("s", [StreamLedger(2, 0, 2), StreamLedger(3, 3, None)], read)
    return final


def kinds(report) -> list[str]:
    return sorted(v.kind for v in report.violations)


def test_payloads_name_where_they_were_sent():
    data = payload("lw-1.1", 7, 3, 50)
    assert len(data) == 50 and parse_payload(data) == ("lw-1.1", 7, 3)
    assert parse_payload(data[:-1] + b"x") is None
    assert parse_payload(b"not a soak payload") is None


def test_a_clean_history_passes_and_counts_outcomes_faults_and_availability():
    history = [append("lw", 1, e) for e in range(5)] + [stream_append("sw", 2, e, e) for e in range(3)]
    history.append(append("lw", 1, 5, outcome=UNKNOWN, error="NodeError: node-1 failed"))
    history.append({"t": 11.0, "t_end": 11.1, "actor": "r", "op": "read", "outcome": OK, "ledger": 1, "first": 2,
                    "digests": [digest(p) for p in entries("lw", 1, 5)[2:]]})
    history.sort(key=lambda r: r["t"])
    faults = [{"fault": "node-kill", "t": 10.015, "t_end": 10.025, "nodes": ["node-1"]},
              {"fault": "node-pause", "t": 10.015, "t_end": 10.025, "nodes": ["node-2"]}]
    report = check(state_with_stream(), history, faults)
    assert report.violations == []
    assert report.ops == 10 and report.outcomes[OK] == 9 and report.outcomes[UNKNOWN] == 1
    assert report.faults == {"node-kill": 1, "node-pause": 1}
    # the appends invoked at 10.02 (two nodes faulty) do not count; the unknown one does, and was not acked
    assert (report.acked_available, report.attempted_available) == (6, 7)
    line = report.line(2, 7)
    assert line.startswith("soak: 2 minutes, seed 7, ops 10 (acked 9, failed 0, unknown 1), faults 2 by kind "
                           "(node-kill 1, node-pause 1), lost 0, duplicated 0, divergent 0, orphaned 0; ")
    assert "append availability 85.71% (6/7" in line


def test_an_ack_beyond_the_close_is_lost():
    report = check(state_with_stream(), [append("lw", 1, 5)], [])
    assert kinds(report) == ["lost"]
    assert "closed at entry 4: acknowledged after its ledger was fenced or closed" in report.violations[0].detail


def test_an_acked_stream_offset_the_stream_does_not_hold_is_lost():
    report = check(state_with_stream(), [stream_append("sw", 3, 1, offset=5)], [])
    assert kinds(report) == ["lost"] and "stream offset 5" in report.violations[0].detail


def test_an_entry_sent_elsewhere_and_a_reader_that_saw_something_else_diverge():
    final = FinalState({}, {}, {}, {}, [])
    final.add_ledger(ledger(1, 1, soak_role="ledger"), [payload("lw", 1, 0, 100), payload("lw", 9, 1, 100)])
    seen = {"t": 1.0, "t_end": 1.1, "actor": "r", "op": "read", "outcome": OK, "ledger": 1, "first": 0,
            "digests": [digest(payload("lw", 1, 0, 100)), "0000"]}
    report = check(final, [seen], [])
    assert kinds(report) == ["divergent", "divergent"]
    assert "ledger 1 entry 1 holds the payload lw sent as ledger 9 entry 1" in report.violations[0].detail


def test_stream_gaps_overlaps_and_disagreeing_stream_reads_are_found():
    final = FinalState({}, {}, {}, {}, [])
    final.add_ledger(ledger(2, 2, stream="s"), entries("sw", 2, 3))
    final.add_ledger(ledger(3, 1, stream="s"), entries("sw", 3, 2))
    final.add_stream("s", [StreamLedger(2, 0, 2), StreamLedger(3, 4, 5)], [])
    assert kinds(check(final, [], [])).count("divergent") >= 2  # the gap at offset 3; the stream read missed all
    final = FinalState({}, {}, {}, {}, [])
    final.add_ledger(ledger(2, 2, stream="s"), entries("sw", 2, 3))
    final.add_ledger(ledger(3, 1, stream="s"), entries("sw", 3, 2))
    read = [(o, 2, o, digest(payload("sw", 2, o, 100))) for o in range(3)]
    read += [(2, 3, 0, digest(payload("sw", 3, 0, 100))), (3, 3, 1, digest(payload("sw", 3, 1, 100)))]
    final.add_stream("s", [StreamLedger(2, 0, 2), StreamLedger(3, 2, 3)], read)
    assert "duplicated" in kinds(check(final, [], []))


def test_closes_and_recoveries_agree_with_the_final_close():
    close = {"t": 1.0, "t_end": 1.1, "actor": "lw", "op": "close", "outcome": OK, "ledger": 1, "last_entry": 4}
    recover = {**close, "actor": "janitor", "op": "recover", "last_entry": 3}
    report = check(state_with_stream(), [close, recover], [])
    assert kinds(report) == ["divergent"]
    assert "janitor's recover of ledger 1 returned last entry 3, the ledger closed at entry 4" in \
        report.violations[0].detail


def test_a_stream_ledger_the_stream_never_got_is_an_orphan():
    final = state_with_stream()
    final.add_ledger(ledger(4, -1, stream="s", stream_owner="stream-writer-x"), [])
    report = check(final, [], [])
    assert kinds(report) == ["orphaned"]
    assert "ledger 4 (CLOSED, last entry -1) was made for stream 's' (owner stream-writer-x)" in \
        report.violations[0].detail


def test_an_open_ledger_after_the_final_recovery_is_reported():
    final = FinalState({}, {}, {}, {}, [])
    final.add_ledger(ledger(1, -1, closed=False, soak_role="ledger"), entries("lw", 1, 2))
    assert kinds(check(final, [append("lw", 1, 1)], [])) == ["unrecovered"]
