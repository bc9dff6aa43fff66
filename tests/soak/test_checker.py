"""The soak's checker fed by hand: a clean history passes, and each kind of violation is found and named;
with --spark, Spark streams built from lists in a local SparkSession."""
from __future__ import annotations

import pytest

from connector.soak import spark_actor
from connector.soak.checker import FinalState, SparkSummary, check, check_spark
from connector.soak.history import FAILED, OK, UNKNOWN, HistoryWriter, digest, parse_payload, payload, read_records
from connector.soak.spark_actor import RATE, SCHEMA, SparkOutput, last_batch, rate_end, tag_rows
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


# -- --spark: the Spark stream fed by hand (a real local SparkSession, DataFrames built from lists) -------------


@pytest.fixture(scope="module")
def spark():
    """A session of this module's own, unless this process has one already: getOrCreate then hands out that one
    (the Spark tests' session, which runs on the same xdist worker after this module), which stays up."""
    from pyspark.sql import SparkSession

    existing = SparkSession.getActiveSession()
    session = spark_actor.session("soak-checker-tests")
    yield session
    if existing is None:
        session.stop()


def spark_output(spark, rate_values, batches=(), committed_end=10, spark_committed_end=None) -> SparkOutput:
    """A Spark stream holding rate_values and each (tag, values) of batches; the sink committed rate values
    0..committed_end-1."""
    rows = [(v, RATE) for v in rate_values] + [(v, tag) for tag, values in batches for v in values]
    return SparkOutput(spark.createDataFrame(rows, SCHEMA), committed_end,
                       committed_end if spark_committed_end is None else spark_committed_end)


def spark_batch(tag: str, outcome: str) -> dict:
    return {"t": 20.0, "t_end": 21.0, "actor": tag.split("/")[0], "op": "spark-batch", "outcome": outcome,
            "tag": tag, "rows": tag_rows(tag)}


def query_start(run: str) -> dict:
    return {"t": 1.0, "t_end": 1.5, "actor": "spark.1", "op": "query-start", "outcome": OK, "run": run, "query": "q"}


def test_exactly_once_spark_output_passes_and_goes_into_the_line(spark):
    output = spark_output(spark, range(10), batches=[("spark.1/0/5", range(5)), ("spark.2/0/3", range(3))])
    history = [query_start("first"), query_start("restart"), query_start("drain"),
               spark_batch("spark.1/0/5", OK), spark_batch("spark.1/1/4", UNKNOWN)]  # spark.2/0/3: never recorded
    violations, summary = check_spark(output, history)
    assert violations == []
    assert summary == SparkSummary(rows=18, batches=1, restarts=1)
    report = check(state_with_stream(), [], [])
    report.spark = summary
    assert "orphaned 0; spark rows 18 (batches 1, query restarts 1); append availability" in report.line(1, 15)


def test_a_duplicated_and_a_missing_rate_value_are_reported(spark):
    values = [v for v in range(10) if v != 7] + [5]  # 5 twice, 7 never
    violations, _ = check_spark(spark_output(spark, values), [])
    assert sorted((v.kind, v.detail) for v in violations) == [
        ("duplicated", "the streaming query's output holds rate values 5 more than once"),
        ("lost", "the streaming query's output lacks rate values 7 (its commits end at 9)"),
    ]


def test_rate_rows_beyond_the_commits_and_a_sink_behind_sparks_commit_log_are_reported(spark):
    violations, _ = check_spark(spark_output(spark, range(12), committed_end=10, spark_committed_end=10), [])
    assert [(v.kind, v.detail) for v in violations] == [
        ("divergent", "the streaming query's output holds 2 rows of rate values 10..11, beyond its committed "
                      "batches' end 9")]
    violations, _ = check_spark(spark_output(spark, range(4), committed_end=4, spark_committed_end=6), [])
    assert [v.kind for v in violations] == ["lost"]
    assert "Spark's commit log has the streaming query's rows up to rate value 5" in violations[0].detail


def test_batch_writes_are_whole_or_absent_as_their_outcomes_say(spark):
    batches = [("spark.1/1/4", [0, 1, 2, 3, 0, 1, 2, 3]),  # acknowledged, held twice
               ("spark.1/2/4", [0, 1]),                    # unknown, half of it
               ("spark.1/3/2", [0, 1]),                    # reported failed, there
               ("spark.2/0/3", [0, 2])]                    # never recorded (its driver died), part of it
    history = [spark_batch("spark.1/0/4", OK), spark_batch("spark.1/1/4", OK), spark_batch("spark.1/2/4", UNKNOWN),
               spark_batch("spark.1/3/2", FAILED), spark_batch("spark.1/4/2", FAILED)]
    violations, summary = check_spark(spark_output(spark, range(10), batches=batches), history)
    found = {v.detail.split(" ")[2]: v.kind for v in violations}
    assert found == {"spark.1/0/4": "lost", "spark.1/1/4": "duplicated", "spark.1/2/4": "lost",
                     "spark.1/3/2": "duplicated", "spark.2/0/3": "lost"}, violations
    assert summary.batches == 2


def test_checkpoint_offsets_give_the_committed_rate_end(tmp_path):
    """rate_end reads Spark's offsets log as Spark 4 writes it: version, batch metadata, one source offset."""
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    for batch, seconds in ((0, 0), (1, 3), (2, 7)):
        (tmp_path / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0,"conf":{{}}}}\n{seconds}')
        (tmp_path / "offsets" / f".{batch}.crc").write_text("")
    (tmp_path / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    (tmp_path / "commits" / "1").write_text('v1\n{"nextBatchWatermarkMs":0}')
    assert last_batch(tmp_path / "offsets") == 2 and last_batch(tmp_path / "commits") == 1
    assert (rate_end(tmp_path, 2, 100), rate_end(tmp_path, 1, 100), rate_end(tmp_path, None, 100)) == (700, 300, 0)


def test_a_history_file_an_actor_was_killed_writing_keeps_the_records_of_its_next_process(tmp_path):
    """Soak audit 2026-11-29: an actor killed mid-line left a torn line, and its restarted process appended its
    first record to that line: both were undecodable and skipped, so an acknowledged append was never checked."""
    path = tmp_path / "writer-1.jsonl"
    first = HistoryWriter(path, "writer-1")
    first.record("append", OK, 1.0, ledger=7, entry=0)
    first.close()
    with open(path, "a") as f:
        f.write('{"t": 2.0, "actor": "writer-1", "op": "app')      # killed mid-line
    again = HistoryWriter(path, "writer-1")
    again.record("append", OK, 3.0, ledger=7, entry=1)
    again.close()
    assert [(r["ledger"], r["entry"]) for r in read_records(path)] == [(7, 0), (7, 1)]


def test_a_closed_ledger_read_back_short_is_reported_lost():
    """Soak audit 2026-11-29: entries were judged only against the acknowledged appends, so a closed ledger whose
    read came back with fewer entries than its close names, none of them acknowledged, passed."""
    final = FinalState({}, {}, {}, {}, [])
    final.add_ledger(ledger(1, 5, soak_role="ledger"), entries("lw", 1, 3))
    assert [(v.kind, v.detail) for v in final.violations] == [
        ("lost", "ledger 1 is closed at entry 5 but 3 entries were read from it")]
    whole = FinalState({}, {}, {}, {}, [])
    whole.add_ledger(ledger(2, 2, soak_role="ledger"), entries("lw", 2, 3))
    assert whole.violations == []
