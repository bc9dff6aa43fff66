"""Single-owner stream writers: offsets, rolling, reading across ledgers, and fencing handover."""
import signal
import subprocess
import sys
import threading
import time

import pytest
from kazoo.exceptions import ConnectionLoss

from connector.client import LedgerClient, LedgerFencedError, Streams
from connector.client.entry_time import AppendClock
from connector.client.time_search import first_offset_at_or_after
from connector.retention import truncate_stream
from metadata import streams
from metadata.errors import MetadataError, ZooKeeperUnreachableError
from metadata.model import LedgerState
from tests.harness.lost_reply import LostReplies
from tests.harness.poll import poll_until


@pytest.fixture
def client(cluster, metadata_uri):
    cluster(3)
    with LedgerClient(metadata_uri) as c:
        yield c


def offsets_and_payloads(client, name, start=0, end=None):
    return [(e.offset, e.payload) for e in Streams(client).read(name, start, end)]


def test_offsets_are_contiguous_across_rolled_ledgers(client):
    with Streams(client).open_writer("events", max_ledger_entries=4) as writer:
        offsets = [writer.append(f"e{i}".encode()) for i in range(10)]
    assert offsets == list(range(10))
    record = streams.read_stream(client.store, "events").value
    assert [(l.first_offset, l.last_offset) for l in record.tail] == [(0, 3), (4, 7), (8, 9)]
    assert all(client.ledger_metadata(l.ledger_id).state is LedgerState.CLOSED for l in record.tail)
    assert offsets_and_payloads(client, "events") == [(i, f"e{i}".encode()) for i in range(10)]
    assert offsets_and_payloads(client, "events", 3, 8) == [(i, f"e{i}".encode()) for i in range(3, 9)]


def test_reading_includes_the_open_tail_up_to_the_lac(client):
    writer = Streams(client).open_writer("live")
    written = [f"x{i}".encode() for i in range(5)]
    for payload in written:
        writer.append(payload)
    # Readers see what the nodes know to be confirmed: the piggybacked LAC lags by one entry until the
    # idle writer sends an explicit LAC. Every read is a prefix of what was acknowledged, never more.
    def read_all():
        seen = [p for _, p in offsets_and_payloads(client, "live")]
        assert seen == written[: len(seen)]
        return seen == written

    poll_until(read_all, 30, what="the explicit LAC to expose the last entry")
    writer.close()


def test_second_owner_fences_the_first_and_continues_after_its_last_acked_offset(client, metadata_uri):
    first = Streams(client).open_writer("orders")
    acked = [first.append(f"a{i}".encode()) for i in range(20)]
    with LedgerClient(metadata_uri) as other:
        second = Streams(other).open_writer("orders")
        with pytest.raises(LedgerFencedError):
            first.append(b"after takeover")
        assert second.append(b"b0") == acked[-1] + 1
        second.close()
    expected = [(i, f"a{i}".encode()) for i in range(20)] + [(20, b"b0")]
    assert offsets_and_payloads(client, "orders") == expected


def test_handover_from_a_paused_owner_loses_nothing_and_fences_it(client, metadata_uri):
    owner = subprocess.Popen(
        [sys.executable, "-m", "tests.harness.stream_writer_process", metadata_uri, "paused"],
        stdout=subprocess.PIPE, text=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(owner.stdout), daemon=True).start()
    try:
        poll_until(lambda: sum(l.startswith("acked") for l in lines) >= 50, 60, what="the owner's first acks")
        owner.send_signal(signal.SIGSTOP)
        acked_before_pause = [l.split() for l in list(lines) if l.startswith("acked")]

        with Streams(client).open_writer("paused") as new_owner:
            takeover_offset = new_owner.append(b"new owner")
            owner.send_signal(signal.SIGCONT)
            poll_until(lambda: "fenced\n" in lines, 60, what="the old owner to be fenced")
        assert owner.wait(30) == 0

        acked = {int(off): payload.encode() for _, off, payload in (l.split() for l in lines if l.startswith("acked"))}
        assert len(acked) >= len(acked_before_pause)
        stored = dict(offsets_and_payloads(client, "paused"))
        # Every entry acknowledged to the old owner is in the stream, unchanged, before the new owner's.
        assert all(stored[offset] == payload for offset, payload in acked.items())
        assert takeover_offset > max(acked)
        assert stored[takeover_offset] == b"new owner"
        assert sorted(stored) == list(range(takeover_offset + 1))
    finally:
        owner.kill()


@pytest.mark.parametrize("lose", ["after", "before"])
def test_a_roll_whose_stream_update_lost_its_reply_leaves_no_ledger_out_of_the_stream(client, monkeypatch, lose):
    """Found by the soak (seed 15): a roll's stream CAS got ConnectionLoss; the new ledger was created but never in
    the stream (orphaned). The update is read back instead: found if it landed, written if it did not."""
    from kazoo.exceptions import ConnectionLoss

    from metadata.errors import MetadataError

    real = streams.write_stream
    pending = {"lose": None}

    def losing_write(store, record, version, *args, **kwargs):
        lose_now, pending["lose"] = pending["lose"], None
        if lose_now == "before":
            raise MetadataError("connection lost before the request reached ZooKeeper") from ConnectionLoss()
        stored = real(store, record, version, *args, **kwargs)
        if lose_now == "after":
            raise MetadataError("connection lost before the reply") from ConnectionLoss()
        return stored

    monkeypatch.setattr(streams, "write_stream", losing_write)
    with Streams(client).open_writer("events", max_ledger_entries=2) as writer:
        assert [writer.append(f"e{i}".encode()) for i in range(2)] == [0, 1]
        pending["lose"] = lose
        assert writer.append(b"e2") == 2   # rolls first: the roll's stream update loses its reply
        assert writer.append(b"e3") == 3
    record = streams.read_stream(client.store, "events").value
    in_stream = [l.ledger_id for l in record.tail]
    assert [(l.first_offset, l.last_offset) for l in record.tail] == [(0, 1), (2, 3)]
    made_for_stream = [i for i in client.list_ledgers() if client.ledger_metadata(i).custom.get("stream") == "events"]
    assert sorted(made_for_stream) == sorted(in_stream)   # no ledger of the stream left out of it
    assert offsets_and_payloads(client, "events") == [(i, f"e{i}".encode()) for i in range(4)]


def test_a_close_whose_stream_update_lost_its_reply_seals_the_stream_once(client, monkeypatch):
    """The close's stream update (seal the last ledger) whose reply was lost is read back (rule 16): the close
    succeeds and the stream holds the sealed ledger, instead of the close raising after it landed."""
    from kazoo.exceptions import ConnectionLoss

    from metadata.errors import MetadataError

    real = streams.write_stream
    lose = {"next": False}

    def losing_write(store, record, version, *args, **kwargs):
        stored = real(store, record, version, *args, **kwargs)
        if lose.pop("next", False):
            raise MetadataError("connection lost before the reply") from ConnectionLoss()
        return stored

    monkeypatch.setattr(streams, "write_stream", losing_write)
    writer = Streams(client).open_writer("events")
    assert [writer.append(f"e{i}".encode()) for i in range(3)] == [0, 1, 2]
    lose["next"] = True
    writer.close()
    record = streams.read_stream(client.store, "events").value
    assert [(l.first_offset, l.last_offset) for l in record.tail] == [(0, 2)]
    assert offsets_and_payloads(client, "events") == [(i, f"e{i}".encode()) for i in range(3)]


def _losing_reply(monkeypatch, then=lambda: None):
    """streams.write_stream writes, runs then() and raises a lost reply, once armed (arm["on"] = True)."""
    from kazoo.exceptions import ConnectionLoss

    from metadata.errors import MetadataError

    real, arm = streams.write_stream, {"on": False}

    def losing_write(store, record, version, *args, **kwargs):
        stored = real(store, record, version, *args, **kwargs)
        if arm["on"]:
            arm["on"] = False
            then()
            raise MetadataError("connection lost before the reply") from ConnectionLoss()
        return stored

    monkeypatch.setattr(streams, "write_stream", losing_write)
    return arm


def _stream_ledgers_exist(client, name):
    record = streams.read_stream(client.store, name).value
    return all(client.store.exists(f"/ledgers/L{l.ledger_id:010d}") for l in streams.iter_ledgers(client.store, record))


def test_a_takeover_whose_stream_update_lost_its_reply_keeps_its_ledger_and_owns_the_stream(client, monkeypatch):
    """Helper audit 2026-11-29 finding 1a (rules 14, 16): the takeover's stream CAS landed but its reply was lost;
    the writer deleted the new ledger the stream then ended in, and every read and later takeover of the stream
    failed with NoSuchLedgerError. It is read back now: found in the stream, the takeover stands."""
    with Streams(client).open_writer("events") as first:
        assert first.append(b"a") == 0
    arm = _losing_reply(monkeypatch)
    arm["on"] = True
    with Streams(client).open_writer("events") as second:
        assert second.append(b"b") == 1
    assert _stream_ledgers_exist(client, "events")
    with Streams(client).open_writer("events") as third:
        assert third.append(b"c") == 2
    assert offsets_and_payloads(client, "events") == [(0, b"a"), (1, b"b"), (2, b"c")]


@pytest.mark.parametrize("update", ["roll", "takeover"])
def test_a_ledger_whose_stream_update_landed_is_kept_when_another_writer_took_over_before_the_read_back(
        client, metadata_uri, monkeypatch, update):
    """Helper audit 2026-11-29 finding 1b: a roll's stream CAS landed, its reply was lost, and another writer took
    the stream over (recovering and sealing the new ledger) before the read-back; the fenced writer then deleted
    that ledger, which the stream still named. The takeover's own CAS had the same race. A ledger is deleted now
    only when the stream is known not to hold it."""
    with LedgerClient(metadata_uri) as other:
        taken = []
        arm = _losing_reply(monkeypatch, then=lambda: taken.append(Streams(other).open_writer("events")))
        if update == "roll":
            writer = Streams(client).open_writer("events", max_ledger_entries=2)
            assert [writer.append(b"a"), writer.append(b"b")] == [0, 1]
            arm["on"] = True
            with pytest.raises(LedgerFencedError):
                writer.append(b"lost")   # rolls first: the roll lands, then the stream is taken over
        else:
            with Streams(client).open_writer("events") as writer:
                assert [writer.append(b"a"), writer.append(b"b")] == [0, 1]
            arm["on"] = True
            with pytest.raises(LedgerFencedError):
                Streams(client).open_writer("events")
        assert taken[0].append(b"c") == 2
        taken[0].close()
    assert _stream_ledgers_exist(client, "events")
    assert offsets_and_payloads(client, "events") == [(0, b"a"), (1, b"b"), (2, b"c")]


def test_a_failed_takeover_whose_ledger_the_stream_holds_leaves_no_pipeline_running(client, metadata_uri,
                                                                                   monkeypatch):
    """Growth audit 2026-11-29: a takeover that failed with the stream holding its new ledger (its CAS landed, its reply
    was lost, and another writer took over before the read-back) kept that ledger's write handle, and never closed
    nor stopped it: its pipeline stayed in the client and the transport, waking 10 times a second until the client
    closed. It is stopped now, the ledger left to the stream's owner (who recovered it)."""
    with Streams(client).open_writer("events") as writer:
        assert writer.append(b"a") == 0
    with LedgerClient(metadata_uri) as other:
        taken = []
        arm = _losing_reply(monkeypatch, then=lambda: taken.append(Streams(other).open_writer("events")))
        arm["on"] = True
        with pytest.raises(LedgerFencedError):
            Streams(client).open_writer("events")
        failed = streams.read_stream(client.store, "events").value.tail[-2]
        assert failed.ledger_id not in (taken[0].ledger_id, writer.ledger_id) and failed.last_offset == 0
        assert client._pipelines == set() and failed.ledger_id not in client._ctx.transport._sinks[False]
        assert taken[0].append(b"b") == 1
        taken[0].close()
    assert offsets_and_payloads(client, "events") == [(0, b"a"), (1, b"b")]


def test_a_takeover_whose_reply_was_lost_after_another_took_over_and_a_truncation_is_fenced(client, metadata_uri,
                                                                                         monkeypatch):
    """Stream audit 2026-11-29: B's takeover landed, its reply lost; C took over (recovering B's empty ledger) and
    a truncation before C's first offset took B's ledger off the stream and deleted it. B's read-back no longer
    found its ledger, took that for "never landed", fenced C and put the deleted ledger back as the stream's OPEN
    last ledger: no writer, takeover or read of the stream worked again. B is now fenced."""
    with Streams(client).open_writer("s") as first:
        for i in range(5):
            first.append(b"a%d" % i)
    real_write, others = streams.write_stream, []
    with LedgerClient(metadata_uri) as other:
        def landed_then_reply_lost(store, record, version):
            stored = real_write(store, record, version)
            if not others and store is client.store:
                others.append(Streams(other).open_writer("s"))             # C takes over
                head = streams.read_stream(other.store, "s").value
                truncate_stream(other, "s", head.last_ledger.first_offset)  # B's empty ledger goes
                raise MetadataError("connection lost before the reply (scripted)") from ConnectionLoss()
            return stored

        monkeypatch.setattr(streams, "write_stream", landed_then_reply_lost)
        with pytest.raises(LedgerFencedError):
            Streams(client).open_writer("s")
        monkeypatch.setattr(streams, "write_stream", real_write)
        c = others[0]
        assert c.append(b"c0") == 5                                         # C still owns the stream
        c.close()
    assert offsets_and_payloads(client, "s") == [(5, b"c0")]


def test_append_times_never_decrease_across_a_takeover_of_an_empty_ledger(client, metadata_uri):
    """Stream audit 2026-11-29: a writer taking over after an empty recovered ledger (its owner died before
    appending) took that ledger's metadata time as its floor, below an earlier writer's clock that ran ahead: the
    times went down and a time search missed the earlier entries."""
    ahead = AppendClock(now=lambda: time.time() + 300)
    with LedgerClient(metadata_uri) as x_client, LedgerClient(metadata_uri) as y_client:
        x = Streams(x_client).open_writer("t", clock=ahead)
        for i in range(5):
            x.append(b"x%d" % i)                     # X dies without closing
        Streams(y_client).open_writer("t")           # Y takes over and dies before appending
        z = Streams(client).open_writer("t")
        for i in range(5):
            z.append(b"z%d" % i)
        times = [e.time_ms for e in Streams(client).read("t")]
        assert times == sorted(times), times
        record = streams.read_stream(client.store, "t").value
        assert first_offset_at_or_after(client, record, int((time.time() + 100) * 1000)) == 0


def test_a_roll_that_failed_is_made_again_by_the_next_append(client, monkeypatch):
    """Stream audit 2026-11-29: a roll (called directly) that failed after closing its ledger left the writer
    appending to the closed ledger: LedgerClosedError on every append, for as long as the roll limits were not
    reached. The next append makes the roll again."""
    writer = Streams(client).open_writer("r")
    writer.append(b"0")
    writer.append(b"1")
    monkeypatch.setattr(writer, "_new_ledger", lambda: (_ for _ in ()).throw(MetadataError("scripted failure")))
    with pytest.raises(MetadataError):
        writer.roll()
    monkeypatch.undo()
    assert writer.append(b"2") == 2 and writer.append(b"3") == 3
    writer.close()
    assert offsets_and_payloads(client, "r") == [(i, b"%d" % i) for i in range(4)]
    record = streams.read_stream(client.store, "r").value
    assert [(ledger.first_offset, ledger.last_offset) for ledger in record.tail] == [(0, 1), (2, 3)]


def test_a_roll_whose_outcome_was_unknown_is_found_landed_by_the_next_append(client, monkeypatch):
    """Review 2026-11-29: a roll whose update landed while ZooKeeper went away (no read-back possible, and the
    stream could not be read to decide about the new ledger) was made again with another new ledger by the next
    append, which then found the stream's tail not the ledger it closed and fenced the writer itself."""
    writer = Streams(client).open_writer("u")
    writer.append(b"0")
    real_update, real_read = streams.update_stream, streams.read_stream
    landed = []

    def update_then_zookeeper_gone(*args, **kwargs):
        landed.append(real_update(*args, **kwargs))
        monkeypatch.setattr(streams, "read_stream", unreadable_once)
        raise ZooKeeperUnreachableError("ZooKeeper went away after the update (scripted)")

    def unreadable_once(*args, **kwargs):
        monkeypatch.setattr(streams, "read_stream", real_read)
        raise ZooKeeperUnreachableError("ZooKeeper is away (scripted)")

    monkeypatch.setattr(streams, "update_stream", update_then_zookeeper_gone)
    with pytest.raises(ZooKeeperUnreachableError):
        writer.roll()
    monkeypatch.setattr(streams, "update_stream", real_update)
    assert landed and landed[0].value.last_ledger.last_offset is None     # the new ledger is the stream's tail
    assert writer.append(b"1") == 1
    writer.close()
    assert offsets_and_payloads(client, "u") == [(0, b"0"), (1, b"1")]


def is_ledger_create(operation, path, kwargs):
    """A ledger's create: the multi that creates /ledgers/L... (with its placement check)."""
    return operation == "multi" and any(op.startswith("Create:") and "/ledgers/L" in op for op in path.split())


def ledgers_out_of_the_stream(client, name):
    """The ledgers made for the stream that it does not hold, with their states."""
    record = streams.read_stream(client.store, name).value
    held = {ledger.ledger_id for ledger in streams.iter_ledgers(client.store, record)}
    made = {i: client.ledger_metadata(i) for i in client.list_ledgers()}
    return {i: meta.state.name for i, meta in made.items() if meta.custom.get("stream") == name and i not in held}


def test_a_takeover_whose_ledger_create_lost_its_reply_adopts_that_ledger(client, monkeypatch):
    """Lost-reply audit 2026-11-29 (finding 2): the create of a takeover's ledger landed and its reply was lost; the
    stream's update loop took that for a lost reply of its own write and ran the takeover again, which created a
    second ledger: the first stayed OPEN for good, named by no stream. The create now reads its ledger back."""
    lost = LostReplies(monkeypatch, is_ledger_create)
    with Streams(client).open_writer("events") as writer:
        assert [writer.append(b"x%d" % i) for i in range(3)] == [0, 1, 2]
    assert len(lost.lost) == 1
    assert ledgers_out_of_the_stream(client, "events") == {}
    assert offsets_and_payloads(client, "events") == [(i, b"x%d" % i) for i in range(3)]


def test_a_roll_whose_ledger_create_lost_its_reply_adopts_that_ledger(client, monkeypatch):
    """Lost-reply audit 2026-11-29 (finding 2): the append that rolled raised, and the next one rolled to another new
    ledger: the first new one stayed OPEN for good, named by no stream."""
    with Streams(client).open_writer("events", max_ledger_entries=2) as writer:
        assert [writer.append(b"x%d" % i) for i in range(2)] == [0, 1]
        lost = LostReplies(monkeypatch, is_ledger_create)
        assert writer.append(b"x2") == 2   # rolls: the new ledger's create lands, its reply is lost
        assert writer.append(b"x3") == 3
    assert len(lost.lost) == 1
    assert ledgers_out_of_the_stream(client, "events") == {}
    record = streams.read_stream(client.store, "events").value
    assert [(ledger.first_offset, ledger.last_offset) for ledger in record.tail] == [(0, 1), (2, 3)]
