"""The node's copy-free AddRequest decoder agrees with the generic protobuf decoder."""
from __future__ import annotations

from google.protobuf.message import DecodeError
from hypothesis import given, settings, strategies as st

from protos import ledger_pb2 as pb
from protos import wire
from storage_node.add_request import LARGE_ENTRY_BYTES, AddRequest, parse_add_request, parse_in_place

int64s = st.integers(-(1 << 63), (1 << 63) - 1)
entries = st.builds(
    pb.AddEntry, ledger_id=int64s, entry_id=int64s, master_key=st.binary(max_size=40),
    flags=st.integers(0, (1 << 32) - 1), last_add_confirmed=int64s, payload=st.binary(max_size=300),
    digest=st.integers(0, (1 << 32) - 1),
)


def _fields(entry) -> tuple:
    return (entry.ledger_id, entry.entry_id, bytes(entry.master_key), entry.flags, entry.last_add_confirmed,
            bytes(entry.payload), entry.digest)


def _both(data: bytes):
    try:
        expected = [_fields(e) for e in pb.AddRequest.FromString(data).entries]
    except DecodeError:
        expected = DecodeError
    try:
        got = [_fields(e) for e in parse_in_place(data).entries]
    except DecodeError:
        got = DecodeError
    return expected, got


@given(st.lists(entries, max_size=5))
def test_valid_requests_decode_alike(batch):
    data = pb.AddRequest(entries=batch).SerializeToString()
    expected, got = _both(data)
    assert got == expected == [_fields(e) for e in batch]


@given(st.lists(entries, min_size=1, max_size=5))
def test_client_frames_decode_alike(batch):
    data = b"".join(wire.add_request(e.ledger_id, e.entry_id, e.master_key, e.flags, e.last_add_confirmed,
                                     e.digest, e.payload) for e in batch)
    expected, got = _both(data)
    assert got == expected == [_fields(e) for e in batch]


@settings(max_examples=1000)
@given(st.lists(entries, max_size=3), st.data())
def test_damaged_requests_decode_alike_or_are_refused(batch, data):
    raw = bytearray(pb.AddRequest(entries=batch).SerializeToString())
    for _ in range(data.draw(st.integers(1, 4))):
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip" and raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] ^= data.draw(st.integers(1, 255))
        elif action == "cut" and raw:
            del raw[data.draw(st.integers(0, len(raw) - 1)):]
        else:
            i = data.draw(st.integers(0, len(raw)))
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=8))
    expected, got = _both(bytes(raw))
    assert got == expected or got is DecodeError, (expected, got)


@given(st.binary(max_size=200))
def test_random_bytes_decode_alike_or_are_refused(raw):
    expected, got = _both(raw)
    assert got == expected or got is DecodeError, (expected, got)


def test_a_large_entry_is_decoded_in_place_and_small_ones_generically():
    large = wire.add_request(1, 2, b"k", 0, 1, 7, b"x" * LARGE_ENTRY_BYTES)
    request = parse_add_request(large)
    assert isinstance(request, AddRequest)
    (entry,) = request.entries
    assert isinstance(entry.payload, memoryview) and entry.payload.obj is large
    assert _fields(entry) == _fields(pb.AddRequest.FromString(large).entries[0])
    small = wire.add_request(1, 3, b"k", 0, 2, 7, b"x" * (LARGE_ENTRY_BYTES - 100))
    assert isinstance(parse_add_request(small + large), pb.AddRequest)
