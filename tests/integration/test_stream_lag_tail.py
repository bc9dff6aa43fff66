"""`ledger stream tail` (issue 16 item 6) and `ledger stream lag`'s errors, against real nodes: rows as JSON lines
from an offset, --follow of a live writer's new rows in a subprocess (ended by --max-rows, Ctrl-C, a closed pipe)
without fencing the writer. The lag of a real streaming query is in tests/spark/test_stream_lag_tail.py."""
import base64
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from connector.cli import main
from connector.client import LedgerClient, Streams
from connector.commands import stream_tail
from connector.retention import truncate_stream
from metadata.errors import OffsetsGoneError
from tests.harness.poll import poll_until

CLI = [sys.executable, "-m", "connector.cli"]
BINARY = bytes([0, 1, 2, 255])


def payload(i: int) -> bytes:
    return BINARY if i == 3 else f"row {i}".encode()


def tail_lines(capsys, *argv) -> list[dict]:
    assert main(["stream", "tail", *argv]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.fixture
def live(cluster, metadata_uri, monkeypatch):
    """Stream 'events': offsets 0..11 in ledgers of 5 entries (offset 3 binary), its writer still open (OPEN tail)."""
    cluster(3)
    monkeypatch.setenv("LEDGER_METADATA", metadata_uri)
    with LedgerClient(metadata_uri) as client, Streams(client).open_writer("events", max_ledger_entries=5) as writer:
        for i in range(12):
            writer.append(payload(i))
        readable(client, 11)
        yield writer


def readable(client: LedgerClient, last: int) -> None:
    """Wait until readers see offset `last` (an idle writer's explicit LAC has reached the nodes)."""
    poll_until(lambda: [e.offset for e in Streams(client).read("events", last)] == [last], 60, what=f"offset {last}")


class LineReader:
    """Reads a subprocess's stdout lines on a thread, so that the test can wait for them with a deadline."""

    def __init__(self, process: subprocess.Popen):
        self.lines: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._read, args=(process.stdout,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.put(line)

    def take(self, count: int, timeout: float = 60.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        taken = []
        while len(taken) < count:
            try:
                taken.append(json.loads(self.lines.get(timeout=max(0.01, deadline - time.monotonic()))))
            except queue.Empty:
                raise AssertionError(f"{len(taken)} of {count} lines within {timeout}s: {taken}") from None
        return taken


def follow(metadata_uri: str, *argv: str) -> subprocess.Popen:
    """`ledger stream tail --follow` as a terminal runs it: with Ctrl-C's default disposition, which a test run
    started in the background by a shell without job control (SIGINT ignored, inherited) would not give it."""
    env = dict(os.environ, LEDGER_METADATA=metadata_uri)
    return subprocess.Popen(CLI + ["stream", "tail", "events", "--follow", "--poll", "0.1", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_tail_prints_rows_from_an_offset_as_json_lines(live, capsys):
    rows = tail_lines(capsys, "events", "--from", "2")
    assert [row["_offset"] for row in rows] == list(range(2, 12))   # the OPEN tail up to its LAC
    assert rows[0] == {"_offset": 2, "payload": "row 2"}
    assert rows[1] == {"_offset": 3, "payload_base64": base64.b64encode(BINARY).decode()}
    assert [row["_offset"] for row in tail_lines(capsys, "events", "--max-rows", "3")] == [0, 1, 2]
    assert tail_lines(capsys, "events", "--from", "latest") == []
    assert tail_lines(capsys, "events", "--from", "500") == []


def test_follow_prints_new_rows_until_max_rows_and_never_fences_the_writer(live, metadata_uri):
    process = follow(metadata_uri, "--from", "10", "--max-rows", "6")
    try:
        reader = LineReader(process)
        assert [row["_offset"] for row in reader.take(2)] == [10, 11]
        for i in range(12, 16):
            live.append(payload(i))   # the writer goes on: the tail fenced nothing
        assert reader.take(4) == [{"_offset": i, "payload": f"row {i}"} for i in range(12, 16)]
        assert process.wait(timeout=60) == 0   # --max-rows 6 ended it
        assert "Traceback" not in process.stderr.read()
    finally:
        process.kill()
        process.wait()
    assert live.append(b"after the tail") == 16


def test_follow_from_latest_sees_only_new_rows_and_ctrl_c_ends_it_quietly(live, metadata_uri):
    process = follow(metadata_uri, "--from", "latest")
    try:
        reader = LineReader(process)
        appended = {}
        for i in range(120):   # until the tail, which starts at the end it finds, prints one
            appended[live.append(f"new {i}".encode())] = f"new {i}"
            try:
                first = json.loads(reader.lines.get(timeout=0.5))
                break
            except queue.Empty:
                continue
        assert first["_offset"] >= 12 and first["payload"] == appended[first["_offset"]]   # none of the old rows
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 130
        assert process.stderr.read() == ""
    finally:
        process.kill()
        process.wait()


def test_a_closed_pipe_ends_follow_quietly(cluster, metadata_uri, tmp_path):
    cluster(3)
    with LedgerClient(metadata_uri) as client, Streams(client).open_writer("events") as writer:
        for i in range(3000):   # ~100 KB of lines: more than a pipe holds, so the tail writes after head is gone
            writer.append_async(f"row {i:05d}".encode())
        writer.append(b"last")
    err = tmp_path / "stderr"
    run = subprocess.run(
        ["bash", "-c", f"{' '.join(CLI)} stream tail events --follow --metadata {metadata_uri} 2>{err} | head -2; "
                       "exit ${PIPESTATUS[0]}"],
        capture_output=True, text=True, timeout=120)
    assert [json.loads(line)["_offset"] for line in run.stdout.splitlines()] == [0, 1]
    assert run.returncode == 141 and err.read_text() == ""


def test_tail_goes_on_from_the_first_offset_after_a_truncation_and_errors_are_one_line(
        cluster, metadata_uri, monkeypatch, capsys):
    cluster(3)
    monkeypatch.setenv("LEDGER_METADATA", metadata_uri)
    with LedgerClient(metadata_uri) as client:
        with Streams(client).open_writer("events", max_ledger_entries=5) as writer:
            for i in range(12):
                writer.append(payload(i))
        truncate_stream(client, "events", 5)
    assert main(["stream", "tail", "events", "--from", "1", "--max-rows", "2"]) == 0
    captured = capsys.readouterr()
    assert [json.loads(line)["_offset"] for line in captured.out.splitlines()] == [5, 6]
    assert "offsets 1..4 are gone" in captured.err and "going on from offset 5" in captured.err

    assert main(["stream", "tail", "nothing-here"]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    for bad in (["--from", "-3"], ["--from", "soon"], ["--max-rows", "0"], ["--poll", "nan"]):
        with pytest.raises(SystemExit) as exited:
            main(["stream", "tail", "events", *bad])
        assert exited.value.code == 2 and "Traceback" not in capsys.readouterr().err


def test_lag_refuses_what_is_not_a_local_checkpoint_in_one_line(cluster, metadata_uri, monkeypatch, capsys, tmp_path):
    cluster(3)
    monkeypatch.setenv("LEDGER_METADATA", metadata_uri)
    for location, expected in ((str(tmp_path / "none"), "no streaming query checkpoint at"),
                               ("hdfs://namenode/checkpoints/q", "is not on the local file system")):
        assert main(["stream", "lag", "--checkpoint", location]) == 1
        err = capsys.readouterr().err
        assert expected in err and err.count("\n") == 1, err
    (tmp_path / "empty" / "offsets").mkdir(parents=True)
    assert main(["stream", "lag", "--checkpoint", str(tmp_path / "empty")]) == 1
    assert "has planned no batch yet" in capsys.readouterr().err


def test_lag_refuses_a_checkpoint_of_a_stream_deleted_and_created_again(cluster, metadata_uri, monkeypatch, capsys,
                                                                       tmp_path):
    """The source's offsets carry the stream's creation time: a lag against a stream created again since the
    checkpoint would compare offsets of two different streams. Said in one line instead."""
    from metadata.streams import read_stream
    from tests.harness.stream_fixtures import delete_head

    cluster(3)
    monkeypatch.setenv("LEDGER_METADATA", metadata_uri)
    with LedgerClient(metadata_uri) as client:
        with Streams(client).open_writer("events") as writer:
            writer.append(payload(0))
        created = read_stream(client.store, "events").value.created_at
        (tmp_path / "offsets").mkdir()
        (tmp_path / "commits").mkdir()
        (tmp_path / "offsets" / "0").write_text(
            'v1\n{"batchWatermarkMs":0,"batchTimestampMs":0}\n'
            + json.dumps({"offset": 1, "stream": "events", "created": created}) + "\n")
        (tmp_path / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}\n')
        assert main(["stream", "lag", "--checkpoint", str(tmp_path)]) == 0
        capsys.readouterr()
        delete_head(client.store, "events")
        with Streams(client).open_writer("events") as writer:
            writer.append_many([payload(i) for i in range(5)])
    assert main(["stream", "lag", "--checkpoint", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "deleted and created again" in err and err.count("\n") == 1, err


def test_follow_goes_on_when_a_cut_deletes_what_it_was_reading(live, metadata_uri, capsys, monkeypatch):
    """Stream audit 2026-11-29: a retention run or truncation deleting a ledger between --follow's read of the
    head and its read of the ledger ended the follow with an error; it now reads the head again and goes on."""
    real_lines, cuts = stream_tail._lines, []

    def cut_once(lc, name, offset, password):
        if not cuts:
            cuts.append(offset)
            raise OffsetsGoneError("offsets are no longer all in its pages (scripted: a cut meanwhile)")
        return real_lines(lc, name, offset, password)

    monkeypatch.setattr(stream_tail, "_lines", cut_once)
    rows = tail_lines(capsys, "events", "--follow", "--poll", "0.05", "--from", "8", "--max-rows", "4")
    assert cuts == [8] and [row["_offset"] for row in rows] == [8, 9, 10, 11]


def test_tail_skips_an_entry_of_an_arrow_stream_that_is_not_arrow_with_a_warning(cluster, metadata_uri, capsys):
    """`stream tail` decodes an arrow stream's entries as `read --format rows` does (an audit found pyarrow's
    ArrowInvalid traceback there): an entry that is not arrow is named on stderr, and the other rows are printed."""
    import pyarrow as pa

    from connector.spark.encoding import MAGIC, encode_entry
    from metadata import streams
    from metadata.model import StreamLedger, StreamRecord

    cluster(3)
    rows = pa.record_batch({"id": pa.array([7, 8], pa.int64())})
    with LedgerClient(metadata_uri) as client:
        with client.create_ledger(3, 3, 2) as writer:
            writer.append(encode_entry(0, [rows]))
            writer.append(MAGIC + b"garbage not arrow")
        streams.create_stream(client.store, StreamRecord("events", "arrow",
                                                         tail=(StreamLedger(writer.ledger_id, 0, 1),)))
    assert main(["stream", "tail", "events", "--metadata", metadata_uri]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line) for line in out.splitlines()] == [{"_offset": 0, "id": 7}, {"_offset": 1, "id": 8}]
    assert err.startswith(f"ledger: warning: ledger {writer.ledger_id} entry 1 of the arrow stream is not an arrow "
                          "entry ("), err
    assert f"its rows are skipped; `ledger read {writer.ledger_id} --from 1 --to 1 --format hex` prints it" in err
