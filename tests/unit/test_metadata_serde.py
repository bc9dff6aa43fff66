import json

import pytest

from metadata import serde
from metadata.errors import MetadataFormatError
from metadata.model import (
    ByteCount,
    Cookie,
    Fragment,
    LedgerMetadata,
    LedgerState,
    NodeRegistration,
    NodeState,
    Retention,
    StreamLedger,
    StreamRecord,
    make_custom_metadata,
)

LEDGER = LedgerMetadata(
    ledger_id=42,
    ensemble_size=3,
    write_quorum=2,
    ack_quorum=2,
    fragments=(Fragment(0, ("a", "b", "c")), Fragment(17, ("a", "d", "c"))),
    state=LedgerState.CLOSED,
    last_entry_id=99,
    length=12345,
    password_hash="ff",
    custom_metadata=make_custom_metadata({"stream": "events", "partition": 3}),
    writer_id="w-1",
    created_at=1.5,
)


def test_ledger_round_trip():
    assert serde.decode_ledger(serde.encode_ledger(LEDGER)) == LEDGER


def test_copy_drops_is_written_only_once_a_node_dropped_copies_and_reads_as_none_when_absent():
    assert "copy_drops" not in json.loads(serde.encode_ledger(LEDGER))
    dropped = LEDGER.with_copies_dropped().with_copies_dropped()
    assert json.loads(serde.encode_ledger(dropped))["copy_drops"] == 2
    assert serde.decode_ledger(serde.encode_ledger(dropped)) == dropped


def test_other_records_round_trip():
    node = NodeRegistration("n1", "127.0.0.1:5000", NodeState.READ_ONLY, "/d", 7)
    cookie = Cookie("n1", "uuid", "/d", 2.0)
    stream = StreamRecord("events", "arrow", "schema", (StreamLedger(1, 0, 9), StreamLedger(2, 10)), (("q", 3),))
    assert serde.decode_node(serde.encode_node(node)) == node
    assert serde.decode_cookie(serde.encode_cookie(cookie)) == cookie
    assert serde.decode_stream(serde.encode_stream(stream)) == stream


def test_a_node_registration_carries_disk_use_and_health_and_an_older_one_without_them_still_reads():
    node = NodeRegistration("n1", "127.0.0.1:5000", NodeState.READ_ONLY, "/d", 7, "127.0.0.1:9100",
                            read_only_reason="disk is 96.0% full", disk_used_bytes=5 << 30,
                            disk_capacity_bytes=8 << 30, disk_fill=0.9612, health="broken: journal fsync failed")
    assert serde.decode_node(serde.encode_node(node)) == node and node.broken
    older = {"format_version": 1, "kind": "node", "node_id": "n1", "address": "127.0.0.1:5000",
             "state": "available", "data_dir": "/d", "pid": 7}
    decoded = serde.decode_node(json.dumps(older).encode())
    assert decoded == NodeRegistration("n1", "127.0.0.1:5000", NodeState.AVAILABLE, "/d", 7)
    assert (decoded.health, decoded.disk_capacity_bytes, decoded.broken) == ("", 0, False)


def test_records_carry_a_format_version_and_unknown_versions_are_refused():
    record = json.loads(serde.encode_ledger(LEDGER))
    assert record["format_version"] == serde.FORMAT_VERSION
    record["format_version"] = 99
    with pytest.raises(MetadataFormatError, match="format version 99"):
        serde.decode_ledger(json.dumps(record).encode())


def test_damaged_record_is_a_clear_error():
    with pytest.raises(MetadataFormatError, match="damaged ledger record"):
        serde.decode_ledger(b"{not json")


def test_fragment_lookup_and_replacement():
    assert LEDGER.ensemble_for(16) == ("a", "b", "c")
    assert LEDGER.ensemble_for(17) == ("a", "d", "c")
    # Rule 3: a fragment starting at the same entry replaces the last one.
    replaced = LEDGER.with_ensemble_from(17, ("a", "e", "c"))
    assert replaced.fragments == (Fragment(0, ("a", "b", "c")), Fragment(17, ("a", "e", "c")))
    appended = LEDGER.with_ensemble_from(20, ("x", "d", "c"))
    assert [f.first_entry_id for f in appended.fragments] == [0, 17, 20]
    assert LEDGER.fragment_ranges() == [(0, 16, LEDGER.fragments[0]), (17, 99, LEDGER.fragments[1])]


def old_stream_record(ledgers, commits, base_offset=0, **extra) -> bytes:
    """A stream record as software before paged streams wrote it (format version 1, every ledger in it)."""
    return json.dumps({
        "format_version": 1, "kind": "stream", "name": "events", "format": "arrow", "schema": "s",
        "ledgers": ledgers, "commits": commits, "base_offset": base_offset, "owner": "", "created_at": 1.0,
        **extra,
    }).encode()


def test_a_stream_head_keeps_its_tail_first_offset_and_commit_order():
    head = StreamRecord("events", "arrow", "s", (StreamLedger(7, 100, 109),), (("b", 2), ("a", 9)),
                        jobs=(("j", "committed"),), first_offset=100)
    encoded = json.loads(serde.encode_stream(head))
    assert encoded["format_version"] == serde.STREAM_FORMAT_VERSION and "ledgers" not in encoded
    assert serde.decode_stream(serde.encode_stream(head)) == head   # commits stay least recent first


def test_an_old_stream_record_reads_as_a_head_whose_tail_holds_every_ledger():
    old = serde.decode_stream(old_stream_record([[1, 5, 9], [2, 10, None]], {"q": 3, "p": 1}, jobs=[["j", "aborted"]]))
    assert old.tail == (StreamLedger(1, 5, 9), StreamLedger(2, 10, None))
    assert old.first_offset == 5 and dict(old.commits) == {"q": 3, "p": 1} and old.jobs == (("j", "aborted"),)
    emptied = serde.decode_stream(old_stream_record([], {}, base_offset=100))
    assert emptied.tail == () and emptied.first_offset == 100 and emptied.next_offset == 100


def test_pages_round_trip():
    ledgers = (StreamLedger(1, 0, 9), StreamLedger(3, 10, 10))
    assert serde.decode_page(serde.encode_page(ledgers)) == ledgers


def test_a_head_keeps_its_retention_and_byte_count_and_one_without_them_reads_as_none_set():
    head = StreamRecord("events", "arrow", retention=Retention(max_age=604800.0, max_bytes=10 ** 11),
                        byte_count=ByteCount(100, 5000, 123456))
    assert serde.decode_stream(serde.encode_stream(head)) == head
    plain = json.loads(serde.encode_stream(StreamRecord("events")))
    assert "retention" not in plain and "byte_count" not in plain   # heads without them stay as they were
    decoded = serde.decode_stream(serde.encode_stream(StreamRecord("events")))
    assert decoded.retention == Retention() and not decoded.retention.is_set and decoded.byte_count is None


def test_a_retention_update_sets_keeps_or_removes_each_limit():
    week = Retention(max_age=604800.0)
    assert week.updated(max_bytes=100) == Retention(604800.0, 100)
    assert week.updated(max_age=60) == Retention(max_age=60)
    assert Retention(60, 100).updated(max_age=-1) == Retention(max_bytes=100)
    assert Retention(60, 100).updated() == Retention(60, 100)
