"""Recovery against real nodes (rules 10-13): fencing a live writer, a zombie writer process, a frozen node,
too many unknowns, the danger of AQ=1, a wrong password, and concurrent recoveries."""
import concurrent.futures
import subprocess
import sys
import threading

import pytest

from connector.client import (
    LedgerClient,
    LedgerFencedError,
    RecoveryIncompleteError,
    Retry,
    UnauthorizedError,
)
from metadata.model import LedgerState
from protos import wire
from tests.harness.background_writer import BackgroundWriter
from tests.harness.poll import poll_until


def read_all(client, ledger_id, last):
    return {e.entry_id: e.payload for e in client.open_ledger(ledger_id).read(0, last)}


def test_recovery_fences_a_live_writer_and_keeps_every_acked_entry(cluster, metadata_uri):
    cluster(3)
    with LedgerClient(metadata_uri) as writer_client, LedgerClient(metadata_uri) as recoverer:
        w = writer_client.create_ledger(3, 3, 2)
        background = BackgroundWriter(w)
        poll_until(lambda: len(background.acked) >= 300, 30, what="300 acknowledged adds")
        meta = recoverer.recover_ledger(w.ledger_id)
        poll_until(lambda: background.error is not None, 30, what="the writer to be fenced")
        assert isinstance(background.error, LedgerFencedError)
        assert "is fenced: another client recovered it; an entry not acknowledged" in str(background.error)
        with pytest.raises(LedgerFencedError):
            w.append(b"after recovery")
        assert meta.state is LedgerState.CLOSED
        assert meta.last_entry_id >= max(background.acked)
        stored = read_all(recoverer, w.ledger_id, meta.last_entry_id)
        assert all(stored[e] == payload for e, payload in background.acked.items())
        assert sorted(stored) == list(range(meta.last_entry_id + 1))


def test_zombie_writer_process_is_fenced_after_sigcont_and_loses_nothing(cluster, metadata_uri):
    cluster(3)
    writer = subprocess.Popen([sys.executable, "-m", "tests.harness.zombie_writer", metadata_uri],
                              stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(writer.stdout.readline, "")), daemon=True).start()
    try:
        poll_until(lambda: sum(line.startswith("ACK") for line in lines) >= 50, 30, what="the writer's acks")
        writer.send_signal(subprocess.signal.SIGSTOP)
        ledger_id = int(lines[0].split()[1])
        acked_before_pause = [int(line.split()[1]) for line in list(lines) if line.startswith("ACK")]
        with LedgerClient(metadata_uri) as recoverer:
            meta = recoverer.recover_ledger(ledger_id)
            writer.send_signal(subprocess.signal.SIGCONT)
            poll_until(lambda: any(line.startswith("FAILED") for line in lines), 30, what="the zombie to fail")
            assert writer.wait(30) == 0
            assert [line for line in lines if line.startswith("FAILED")] == ["FAILED LedgerFencedError\n"]
            acked = [int(line.split()[1]) for line in lines if line.startswith("ACK")]
            assert acked[:len(acked_before_pause)] == acked_before_pause
            assert max(acked) <= meta.last_entry_id  # an ack that arrived after SIGCONT was recovered too
            stored = read_all(recoverer, ledger_id, meta.last_entry_id)
            assert all(stored[e] == b"payload-%d" % e for e in acked)
            assert recoverer.ledger_metadata(ledger_id).last_entry_id == meta.last_entry_id
    finally:
        writer.kill()
        writer.wait()


def test_recovery_with_one_node_frozen_completes_through_coverage(cluster, metadata_uri):
    nodes = cluster(3)
    with LedgerClient(metadata_uri, timeout=30.0) as writer_client, LedgerClient(metadata_uri, timeout=30.0) as rc:
        w = writer_client.create_ledger(3, 3, 2)
        for i in range(100):
            w.append(b"e%d" % i)
        nodes[1].pause()
        try:
            meta = rc.recover_ledger(w.ledger_id)  # a 30 s read timeout: coverage, not the timeout, ends it
            assert (meta.state, meta.last_entry_id) == (LedgerState.CLOSED, 99)
            assert [e.payload for e in rc.open_ledger(w.ledger_id).read(0, 99)] == [b"e%d" % i for i in range(100)]
            with pytest.raises(LedgerFencedError):
                w.append(b"late")
        finally:
            nodes[1].resume()


def test_too_many_unknowns_close_nothing_and_a_retry_closes_at_the_right_entry(cluster, metadata_uri):
    nodes = cluster(3)
    with LedgerClient(metadata_uri) as writer_client, LedgerClient(metadata_uri, timeout=1.5) as rc:
        w = writer_client.create_ledger(3, 3, 2)
        for i in range(30):
            w.append(b"e%d" % i)
        nodes[0].pause()
        nodes[2].pause()
        try:
            with pytest.raises(RecoveryIncompleteError, match="nothing was closed"):
                rc.recover_ledger(w.ledger_id)
            assert rc.ledger_metadata(w.ledger_id).state is not LedgerState.CLOSED
        finally:
            nodes[0].resume()
            nodes[2].resume()
        meta = rc.recover_ledger_with_retry(w.ledger_id, retry=Retry(deadline=60))
        assert (meta.state, meta.last_entry_id) == (LedgerState.CLOSED, 29)


def test_ack_quorum_of_one_with_a_node_down_stalls_instead_of_truncating(cluster, metadata_uri):
    nodes = cluster(3)
    with LedgerClient(metadata_uri) as writer_client, LedgerClient(metadata_uri, timeout=1.5) as rc:
        w = writer_client.create_ledger(3, 3, 1)
        for i in range(20):
            w.append(b"e%d" % i)
        nodes[2].kill()
        with pytest.raises(RecoveryIncompleteError):
            rc.recover_ledger(w.ledger_id)
        assert rc.ledger_metadata(w.ledger_id).state is not LedgerState.CLOSED
        nodes[2].start()
        meta = rc.recover_ledger_with_retry(w.ledger_id, retry=Retry(deadline=60))
        assert meta.last_entry_id == 19


def test_wrong_password_fences_nothing_and_the_writer_continues(cluster, metadata_uri):
    cluster(3)
    with LedgerClient(metadata_uri) as writer_client, LedgerClient(metadata_uri) as intruder:
        w = writer_client.create_ledger(password=b"right")
        w.append(b"one")
        with pytest.raises(UnauthorizedError, match="wrong password"):
            intruder.open_ledger(w.ledger_id, password=b"wrong")
        with pytest.raises(UnauthorizedError):
            intruder.recover_ledger(w.ledger_id, password=b"")
        assert intruder.ledger_metadata(w.ledger_id).state is LedgerState.OPEN
        assert w.append(b"two") == 1
        assert w.close().last_entry_id == 1


def test_ten_clients_recovering_at_once_agree_on_one_last_entry(cluster, metadata_uri):
    cluster(3)
    with LedgerClient(metadata_uri) as writer_client:
        w = writer_client.create_ledger(3, 3, 2)
        futures = [w.append_async(b"e%d" % i) for i in range(500)]
        acked = max(f.result(timeout=60) for f in futures)
        clients = [LedgerClient(metadata_uri) for _ in range(10)]
        try:
            barrier = threading.Barrier(10)

            def recover(client):
                barrier.wait()
                return client.open_ledger(w.ledger_id).last_entry_id

            with concurrent.futures.ThreadPoolExecutor(10) as pool:
                results = list(pool.map(recover, clients))
        finally:
            for client in clients:
                client.close()
        assert set(results) == {writer_client.ledger_metadata(w.ledger_id).last_entry_id}
        assert results[0] >= acked


def test_recovery_of_big_entries_writes_back_the_payloads_read_as_views(cluster, metadata_uri):
    """Entries of VIEW_MIN_BYTES or more reach recovery as views into the received messages (protos/wire.py): its
    votes keep them and its write-back appends them. The writer process exits at once after its last
    acknowledgement, before an idle writer's explicit LAC (IDLE_LAC_AFTER), so the nodes know the LAC of the
    entry before the last and the recovery writes the last one back; every entry reads back as written."""
    cluster(3)
    count = 12
    script = (
        "import os, sys\n"
        "from connector.client import LedgerClient\n"
        "from protos import wire\n"
        "lc = LedgerClient(sys.argv[1])\n"
        "w = lc.create_ledger(3, 3, 2)\n"
        f"for i in range({count}):\n"
        "    w.append(bytes([i]) * (wire.VIEW_MIN_BYTES + 1000 * i))\n"
        "print(w.ledger_id, flush=True)\n"
        "os._exit(0)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, metadata_uri], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    ledger_id = int(done.stdout)
    with LedgerClient(metadata_uri) as rc:
        meta = rc.recover_ledger(ledger_id)
        assert (meta.state, meta.last_entry_id) == (LedgerState.CLOSED, count - 1)
        assert [e.payload for e in rc.open_ledger(ledger_id).read()] == [
            bytes([i]) * (wire.VIEW_MIN_BYTES + 1000 * i) for i in range(count)]
