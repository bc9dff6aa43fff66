"""Messages built by protos/wire.py decode, with protobuf's own decoder, to exactly what was put in."""
from __future__ import annotations

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
