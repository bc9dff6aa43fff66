"""Messages built by protos/wire.py decode, with protobuf's own decoder, to exactly what was put in; and the
client's decoder of ReadRangeResponse (wire.read_range_message) reads what protobuf reads."""
from __future__ import annotations

import types

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, strategies as st

from protos import ledger_pb2 as pb
from protos import wire

int64s = st.integers(-(1 << 63), (1 << 63) - 1)
read_entries = st.builds(
    pb.ReadResponse, status=st.sampled_from(list(pb.Status.values())), message=st.text(max_size=20),
    ledger_id=int64s, entry_id=int64s, last_add_confirmed=int64s, payload=st.binary(max_size=300),
    digest=st.integers(0, (1 << 32) - 1),
)


@given(st.lists(read_entries, max_size=5), st.booleans(), st.booleans())
def test_a_read_range_response_built_from_parts_decodes_to_its_entries(entries, done, as_views):
    parts = [pb.ReadRangeResponse(status=pb.OK).SerializeToString()]
    for e in entries:
        payload = memoryview(b"xx" + e.payload)[2:] if as_views else e.payload
        parts += wire.read_range_entry(e.status, e.message, e.ledger_id, e.entry_id, e.last_add_confirmed,
                                       e.digest, payload)
    if done:
        parts.append(pb.ReadRangeResponse(done=True).SerializeToString())
    decoded = pb.ReadRangeResponse.FromString(b"".join(parts))
    assert decoded == pb.ReadRangeResponse(status=pb.OK, entries=entries, done=done)


@given(st.lists(st.builds(pb.AddEntry, ledger_id=int64s, entry_id=int64s, master_key=st.binary(max_size=40),
                          flags=st.integers(0, (1 << 32) - 1), last_add_confirmed=int64s,
                          payload=st.binary(max_size=300), digest=st.integers(0, (1 << 32) - 1)), max_size=5))
def test_joined_add_request_frames_decode_to_their_entries(entries):
    data = b"".join(wire.add_request(e.ledger_id, e.entry_id, e.master_key, e.flags, e.last_add_confirmed,
                                     e.digest, e.payload) for e in entries)
    assert pb.AddRequest.FromString(data) == pb.AddRequest(entries=entries)


@given(int64s, st.binary(min_size=1, max_size=40), st.integers(0, (1 << 32) - 1),
       st.lists(st.tuples(int64s, int64s, st.integers(0, (1 << 32) - 1), st.binary(max_size=300)), max_size=8),
       st.sampled_from(["as drawn", "one LAC", "one LAC and size"]))
def test_a_batch_of_frames_is_add_requests_frame_for_each(ledger_id, key, flags, fields, repeat):
    """add_requests reuses the LAC and payload size of the entry before: the same and changing ones (a writer's
    batch has one LAC, and often one payload size). Each frame is add_request's, and protobuf decodes it to the
    entry put in."""
    adds = [types.SimpleNamespace(entry_id=entry_id, last_add_confirmed=lac, digest=digest, payload=payload)
            for entry_id, lac, digest, payload in fields]
    for add in adds if repeat != "as drawn" else ():
        add.last_add_confirmed = adds[0].last_add_confirmed
        if repeat == "one LAC and size":
            add.payload = adds[0].payload
    frames = wire.add_requests(ledger_id, key, flags, adds)
    assert frames == [
        wire.add_request(ledger_id, a.entry_id, key, flags, a.last_add_confirmed, a.digest, a.payload) for a in adds]
    assert [pb.AddRequest.FromString(frame) for frame in frames] == [pb.AddRequest(entries=[pb.AddEntry(
        ledger_id=ledger_id, entry_id=a.entry_id, master_key=key, flags=flags, last_add_confirmed=a.last_add_confirmed,
        payload=a.payload, digest=a.digest)]) for a in adds]


# -- the client's decoder of ReadRangeResponse (wire.read_range_message) --------------------------------------------

FIELDS = ("status", "message", "ledger_id", "entry_id", "last_add_confirmed", "payload", "digest")
big_payloads = st.binary(min_size=1, max_size=32).map(lambda b: b * (wire.VIEW_MIN_BYTES // len(b) + 1))


def _values(entry) -> tuple:
    return tuple(bytes(getattr(entry, name)) if name == "payload" else getattr(entry, name) for name in FIELDS)


def _same(decoded, expected: pb.ReadRangeResponse) -> None:
    assert (decoded.status, decoded.message, decoded.done) == (expected.status, expected.message, expected.done)
    assert [_values(e) for e in decoded.entries] == [_values(e) for e in expected.entries]


@given(st.lists(read_entries, min_size=1, max_size=4), big_payloads, st.sampled_from(list(pb.Status.values())),
       st.text(max_size=10), st.booleans())
def test_a_read_range_response_with_big_entries_decodes_as_protobuf_does_with_payloads_as_views(
        entries, big, status, message, done):
    entries[0].payload = big
    expected = pb.ReadRangeResponse(status=status, message=message, entries=entries, done=done)
    data = expected.SerializeToString()
    decoded = wire.read_range_message(data)
    _same(decoded, expected)
    assert isinstance(decoded, wire.ReadRangeResponseView)
    assert isinstance(decoded.entries[0].payload, memoryview) and decoded.entries[0].payload.obj is data


@given(st.lists(read_entries, min_size=1, max_size=4))
def test_a_message_of_small_entries_goes_to_protobuf(entries):
    data = pb.ReadRangeResponse(entries=entries).SerializeToString()
    assert isinstance(wire.read_range_message(data), pb.ReadRangeResponse)


def test_fields_in_any_order_and_unknown_fields_decode_as_protobuf_does():
    payload = bytes(range(256)) * (wire.VIEW_MIN_BYTES // 256 + 1)
    head = pb.ReadResponse(status=pb.ERROR, message="m", ledger_id=-7, entry_id=1 << 40, last_add_confirmed=-1,
                           digest=0xFFFFFFFF).SerializeToString()
    unknown = bytes([(9 << 3) | 0, 5, (10 << 3) | 1]) + bytes(8) + bytes([(11 << 3) | 2, 2, 1, 2])
    # payload first, then the rest, then fields this version does not know (varint, fixed64, bytes)
    body = bytes([(6 << 3) | 2]) + wire.varint(len(payload)) + payload + head + unknown
    data = (pb.ReadRangeResponse(done=True).SerializeToString() + bytes([(3 << 3) | 2]) + wire.varint(len(body))
            + body + unknown)
    expected = pb.ReadRangeResponse.FromString(data)
    assert expected.entries[0].payload == payload and expected.entries[0].ledger_id == -7
    _same(wire.read_range_message(data), expected)


def test_a_message_cut_short_does_not_decode():
    data = pb.ReadRangeResponse(entries=[pb.ReadResponse(entry_id=3, payload=bytes(wire.VIEW_MIN_BYTES),
                                                         digest=9)]).SerializeToString()
    for cut in (len(data) - 1, len(data) - 5, 2, 1):
        with pytest.raises(DecodeError):
            wire.read_range_message(data[:cut])
