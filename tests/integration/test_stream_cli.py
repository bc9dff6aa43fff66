"""`ledger stream list|show|truncate|retention|delete` against real nodes, through connector.cli.main, with --json
and as text; errors are one line naming the problem and the fix."""
import io
import json
import time

import pytest

from connector.cli import main
from connector.commands import stream as stream_command
from connector.client import LedgerClient, Streams
from metadata import layout, streams
from metadata.model import Retention, StreamRecord
from tests.harness.poll import poll_until
from tests.harness.stream_fixtures import appended, closed_ledgers


def write_raw_stream(uri: str, name: str, ledgers: int, entries: int, keep_open: bool = False):
    """A raw stream of `ledgers` ledgers of `entries` 10-byte entries each (2 bytes of payload, 8 of append time);
    the writer returned (still owning the stream, its last ledger OPEN) if keep_open."""
    client = LedgerClient(uri)
    writer = Streams(client).open_writer(name, max_ledger_entries=entries)
    for i in range(ledgers * entries):
        writer.append(f"{i % 100:02d}".encode())
    if keep_open:
        return client, writer
    writer.close()
    client.close()
    return None


def run_json(capsys, *argv) -> list[dict]:
    """The command's JSON output: one object (show), or one per line."""
    assert main(["stream", *argv, "--json"]) == 0
    out = capsys.readouterr().out
    return [json.loads(out)] if argv[0] == "show" else [json.loads(line) for line in out.splitlines()]


def test_list_show_truncate_retention_and_delete_with_json(cluster, metadata_uri, capsys, monkeypatch):
    cluster(3)
    monkeypatch.setenv("LEDGER_METADATA", metadata_uri)
    write_raw_stream(metadata_uri, "events", ledgers=4, entries=5)      # offsets 0..19, 4 ledgers of 50 bytes
    live = write_raw_stream(metadata_uri, "live", ledgers=1, entries=3, keep_open=True)
    try:
        listed = {s["name"]: s for s in run_json(capsys, "list")}
        assert listed["events"]["first_offset"] == 0 and listed["events"]["next_offset"] == 20
        assert listed["events"]["open_ledger"] is None
        assert listed["live"]["open_ledger"] is not None and listed["live"]["next_offset"] is None
        assert listed["live"]["owner"] == live[1].owner_id

        [shown] = run_json(capsys, "show", "events")
        assert (shown["ledgers"], shown["bytes"], shown["first_offset"], shown["next_offset"]) == (4, 200, 0, 20)
        assert shown["retention"] == {"max_age": None, "max_bytes": None} and shown["pending_cuts"] == []
        [live_shown] = run_json(capsys, "show", "live")
        assert live_shown["open_ledger"] == live[1].ledger_id and live_shown["owner"] == live[1].owner_id

        [truncated] = run_json(capsys, "truncate", "events", "--before", "7")
        assert (truncated["from_offset"], truncated["first_offset"], truncated["ledgers"]) == (0, 5, 1)
        with LedgerClient(metadata_uri) as lc:
            assert [e.offset for e in Streams(lc).read("events")] == list(range(5, 20))

        [setting] = run_json(capsys, "retention", "events", "--max-bytes", "100", "--max-age", "7d")
        assert setting == {"name": "events", "max_age": 604800.0, "max_bytes": 100}
        assert main(["stream", "retention", "events", "--max-age", "none"]) == 0
        assert capsys.readouterr().out == "stream 'events': retention max bytes 100 bytes\n"
        [applied] = run_json(capsys, "retention", "--apply")   # every stream with a retention: 'events'
        assert (applied["stream"], applied["first_offset"], applied["ledgers"]) == ("events", 10, 1)
        [shown] = run_json(capsys, "show", "events")
        assert shown["bytes"] == 100 and shown["retention"] == {"max_age": None, "max_bytes": 100}

        assert main(["stream", "delete", "events", "--yes"]) == 0
        assert capsys.readouterr().out == "stream 'events' deleted, and 2 of its ledgers\n"
        assert [s["name"] for s in run_json(capsys, "list")] == ["live"]
    finally:
        live[1].close()
        live[0].close()


def test_text_output_and_one_line_errors(cluster, metadata_uri, capsys, monkeypatch):
    cluster(3)
    monkeypatch.setenv("LEDGER_METADATA", metadata_uri)
    client, writer = write_raw_stream(metadata_uri, "live", ledgers=2, entries=5, keep_open=True)
    try:
        writer.roll()   # offsets 0..9 closed, ledger 3 OPEN from offset 10
        assert main(["stream", "list"]) == 0
        listing = capsys.readouterr().out
        assert "live" in listing and "0.. (open)" in listing and "retention" in listing.splitlines()[0]

        assert main(["stream", "show", "live"]) == 0
        shown = capsys.readouterr().out
        assert "offsets       0.. (open)" in shown and f"owner {writer.owner_id}" in shown
        assert "retention     none (keeps everything)" in shown and "commits       none" in shown

        assert main(["stream", "truncate", "live", "--before", "12"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("ledger: error: stream 'live': offsets from 10 are in ledger") and "OPEN" in err
        assert "truncate --before 10 or less" in err and "Traceback" not in err and len(err.splitlines()) == 1

        assert main(["stream", "truncate", "live", "--before", "10"]) == 0
        assert capsys.readouterr().out == "stream 'live' now starts at offset 10 (was 0): 2 ledgers deleted\n"
        assert main(["stream", "truncate", "live", "--before", "10"]) == 0
        assert "nothing removed" in capsys.readouterr().out

        assert main(["stream", "show", "nope"]) == 1
        assert "stream 'nope' does not exist" in capsys.readouterr().err
        assert main(["stream", "delete", "live"]) == 1   # stdin is not a terminal under pytest
        err = capsys.readouterr().err
        assert "confirm with --yes" in err and streams.find_stream(client.store, "live") is not None
        assert main(["stream", "retention"]) == 1
        assert "name a stream" in capsys.readouterr().err
        with pytest.raises(SystemExit):
            main(["stream", "retention", "live", "--max-age", "7 days"])
        assert "is not an age" in capsys.readouterr().err
    finally:
        writer.close()
        client.close()


def test_retention_loop_runs_every_seconds_and_stops_after_its_runs(cluster, metadata_uri, capsys, monkeypatch):
    cluster(3)
    monkeypatch.setenv("LEDGER_METADATA", metadata_uri)
    write_raw_stream(metadata_uri, "events", ledgers=3, entries=2)
    assert main(["stream", "retention", "events", "--max-age", "1s"]) == 0
    capsys.readouterr()
    with LedgerClient(metadata_uri) as lc:
        head = streams.read_stream(lc.store, "events").value
        last_write = max(lc.store.modified_at(layout.ledger_path(s.ledger_id))
                         for s in streams.iter_ledgers(lc.store, head))
    # Retention by age measures the ledgers' last metadata write (their close) by ZooKeeper's clock, this host's.
    poll_until(lambda: time.time() > last_write + 1.05, timeout=10, what="the ledgers to be older than 1s")
    started = time.monotonic()
    assert main(["stream", "retention", "--apply", "--every", "0.5", "--runs", "3", "--json"]) == 0
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert time.monotonic() - started >= 1.0   # three runs, half a second apart
    assert [(r["stream"], r["cut"]) for r in results] == [("events", True)]   # a loop reports what changed
    with LedgerClient(metadata_uri) as lc:
        head = streams.read_stream(lc.store, "events").value
        assert head.first_offset == head.next_offset == 6 and head.tail == ()
        assert head.retention == Retention(max_age=1.0)
        assert lc.store.children(layout.stream_cuts_path("events")) == []


def test_the_retention_loop_prints_only_what_changed_and_exits_with_its_last_runs_status(metadata_uri, store, capsys,
                                                                                        monkeypatch):
    """Growth audit 2026-11-29: a loop printed a line per stream per run (about 7 MB a day for 100 streams every 60 s),
    and kept every failure of every run in a list that only grew and made its exit status 1 for good. A stream
    deleted between the loop's listing and its run fails that run only: here the first run's."""
    monkeypatch.setenv("LEDGER_METADATA", metadata_uri)
    for name in ("events", "quiet"):
        appended(store, name, closed_ledgers(store, 4))     # 4 ledgers of 100 bytes each
    assert main(["stream", "retention", "events", "--max-bytes", "200"]) == 0
    assert main(["stream", "retention", "quiet", "--max-bytes", "1000"]) == 0
    real_apply_all, runs = stream_command.apply_all, []

    def first_run_names_a_deleted_stream(client, names, **kwargs):
        runs.append(names)
        return real_apply_all(client, names + (["deleted-meanwhile"] if len(runs) == 1 else []), **kwargs)

    monkeypatch.setattr(stream_command, "apply_all", first_run_names_a_deleted_stream)
    capsys.readouterr()
    assert main(["stream", "retention", "--apply", "--every", "0.1", "--runs", "3"]) == 0
    out, err = capsys.readouterr()
    assert len(runs) == 3 and out.splitlines() == [
        "stream 'events': retention removed 2 ledgers, offsets 0..19; it now starts at offset 20"]
    assert err.count("stream 'deleted-meanwhile': retention not applied") == 1
    assert main(["stream", "retention", "--apply", "--every", "0.1", "--runs", "2", "--json"]) == 0
    assert capsys.readouterr().out == ""                     # nothing changed
    assert main(["stream", "retention", "--apply", "--json"]) == 0   # one pass reports every stream
    assert sorted((r["stream"], r["cut"]) for r in map(json.loads, capsys.readouterr().out.splitlines())) == [
        ("events", False), ("quiet", False)]


@pytest.mark.parametrize("argv", [["truncate", "..", "--before", "1"], ["truncate", ".", "--before", "1"],
                                  ["truncate", "a/b", "--before", "1"], ["retention", "--apply", ".."]])
def test_what_is_no_stream_name_is_refused_in_one_line(metadata_uri, capsys, argv):
    """An audit's: '..' and '.' became znode paths (of the stream's cuts) before the name was checked, and kazoo's
    "ValueError: relative paths not allowed" came out as a traceback."""
    assert main(["stream", *argv, "--metadata", metadata_uri]) == 1
    err = capsys.readouterr().err
    assert f"invalid stream name {argv[1] if argv[0] == 'truncate' else argv[2]!r}: use 1-200 letters" in err, err
    assert len(err.splitlines()) == 1


def test_end_of_input_at_the_delete_prompt_deletes_nothing(metadata_uri, capsys, monkeypatch):
    """An audit's: Ctrl-D at the confirmation prompt ended `stream delete` with an EOFError traceback."""
    with LedgerClient(metadata_uri) as client:
        streams.create_stream(client.store, StreamRecord("events", "raw"))

        class Terminal(io.StringIO):   # a terminal on which the user pressed Ctrl-D
            def isatty(self):
                return True

        monkeypatch.setattr("sys.stdin", Terminal(""))
        assert main(["stream", "delete", "events", "--metadata", metadata_uri]) == 1
        assert capsys.readouterr().err.endswith("ledger: error: stream 'events' not deleted: no name was typed\n")
        assert not streams.find_stream(client.store, "events").value.deleting
