"""Hostile input against a real node process: hypothesis-generated malformed, truncated and garbage requests
(bad, negative and huge ids, oversized payloads, wrong keys and digests, every flag, out-of-order entry ids),
floods of streams, and ids at wide strides. The node must answer each with a well-defined status, never
crash, and never change or lose acknowledged data: afterwards, and after a crash and restart, every
acknowledged entry reads back byte for byte. The fuzzed ledgers have metadata naming their keys' passwords, so the
node binds their keys after the first-sight check (storage_node/key_check.py); the other ids have none."""
from __future__ import annotations

import asyncio
import collections
import dataclasses

import grpc
import psutil
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from protos import ledger_pb2 as pb
from protos.digest import entry_digest, master_key
from tests.harness.node_client import PASSWORD, NodeClient, given_ledgers, make_entry, payload_for
from tests.harness.poll import poll_until

MAX_ID = 1 << 62
MAX_ENTRY_BYTES = 4096
NODE_ARGS = ("--max-entry-bytes", str(MAX_ENTRY_BYTES), "--read-only-threshold", "1.0")
PROTECTED, PROTECTED_KEY, PROTECTED_ENTRIES = 1, master_key(b"owner only"), 100
FUZZ_LEDGERS = (2, 3, 4, 5)
FUZZ_KEYS = {ledger: master_key(b"key %d" % ledger) for ledger in FUZZ_LEDGERS}
STRIDED = 9
PASSWORDS = {PROTECTED: b"owner only", STRIDED: PASSWORD, **{ledger: b"key %d" % ledger for ledger in FUZZ_LEDGERS}}
EXAMPLES, ADDS_PER_EXAMPLE, CALLS_PER_EXAMPLE = 200, 40, 12  # 200 * 52 = 10,400 requests
ADD_STATUSES = {pb.OK, pb.BAD_REQUEST, pb.TOO_LARGE, pb.UNAUTHORIZED, pb.FENCED}
CALL_STATUSES = ADD_STATUSES | {pb.NO_LEDGER, pb.NO_ENTRY}
RAW = object()  # "take the next 8 bytes as a signed 64-bit value"
HOSTILE_IDS = (-1, -(1 << 63), MAX_ID - 1, MAX_ID, (1 << 63) - 1, RAW)
HOSTILE_KEYS = (b"", b"k" * 65, b"k" * 1025, b"\0", PROTECTED_KEY[:-1], master_key(b"guess"))
HOSTILE_PAYLOADS = (b"p" * MAX_ENTRY_BYTES, b"p" * (MAX_ENTRY_BYTES + 1), b"p" * 70_000)
METHODS = {"Read": pb.ReadResponse, "ReadLac": pb.ReadLacResponse, "WriteLac": pb.WriteLacResponse,
           "WaitLac": pb.ReadLacResponse, "NodeInfo": pb.NodeInfoResponse, "ReadRange": pb.ReadRangeResponse}


def _int64(value: int) -> int:
    return max(min(value, (1 << 63) - 1), -(1 << 63))


class Provider:
    """Turns hypothesis' bytes into hostile requests, like a coverage fuzzer's data provider: one draw of
    bytes per example keeps 10,000 requests cheap to generate, and shrinking the bytes shrinks the requests.
    Choices are weighted by repetition; past the end of the bytes every choice is the first option."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def byte(self) -> int:
        self.pos += 1
        return self.data[self.pos - 1] if self.pos <= len(self.data) else 0

    def choice(self, options):
        picked = options[self.byte() % len(options)]
        return self.int64() if picked is RAW else picked

    def int64(self) -> int:
        return int.from_bytes(bytes(self.byte() for _ in range(8)), "big", signed=True)

    def blob(self, limit: int) -> bytes:
        return bytes(self.byte() for _ in range(self.byte() % (limit + 1)))

    def entry(self) -> pb.AddEntry:
        ledger_id = self.choice(FUZZ_LEDGERS * 6 + (PROTECTED,) + HOSTILE_IDS)
        entry_id = self.choice(tuple(range(24)) * 2 + (70_000, 10 ** 12) + HOSTILE_IDS)
        own_key = FUZZ_KEYS.get(ledger_id, PROTECTED_KEY[::-1])
        key = self.choice((own_key,) * 12 + HOSTILE_KEYS + tuple(FUZZ_KEYS.values()))
        lac = _int64(self.choice((entry_id - 1,) * 6 + (-1, -2, entry_id, entry_id + 5, RAW)))
        payload = self.choice((b"",) + (None,) * 10 + HOSTILE_PAYLOADS)
        payload = self.blob(48) if payload is None else payload
        flags = self.choice((pb.ADD_FLAG_NONE,) * 6 + (pb.RECOVERY_ADD,) * 2 + (2, 3, 1 << 31, RAW)) % (1 << 32)
        good = 0 <= ledger_id and 0 <= entry_id
        digest = self.choice((entry_digest(ledger_id, entry_id, lac, payload) if good else 0,) * 8 + (0, 12345))
        return pb.AddEntry(ledger_id=ledger_id, entry_id=entry_id, master_key=key, flags=flags,
                           last_add_confirmed=lac, payload=payload, digest=digest)

    def add_message(self) -> bytes:
        data = pb.AddRequest(entries=[self.entry() for _ in range(self.byte() % 5)]).SerializeToString()
        return self.damaged(data)

    def damaged(self, data: bytes) -> bytes:
        """Mostly intact; sometimes truncated, or a bit flipped, or plain garbage."""
        how = self.choice(("intact",) * 5 + ("truncated", "flipped", "garbage"))
        if how == "truncated":
            return data[:self.byte() % max(len(data), 1)]
        if how == "flipped" and data:
            at = self.byte() % len(data)
            return data[:at] + bytes([data[at] ^ (1 << self.byte() % 8)]) + data[at + 1:]
        return self.blob(64) if how == "garbage" else data

    def ledger_id(self) -> int:
        return self.choice(FUZZ_LEDGERS * 2 + (PROTECTED,) + HOSTILE_IDS)

    def call(self) -> tuple[str, bytes]:
        method = self.choice(tuple(METHODS))
        key = self.choice(tuple(FUZZ_KEYS.values()) + HOSTILE_KEYS)
        entry_id = self.choice(tuple(range(30)) + HOSTILE_IDS)
        fence = self.byte() % 4 == 0
        request = {
            "Read": lambda: pb.ReadRequest(ledger_id=self.ledger_id(), entry_id=entry_id, fence=fence, master_key=key),
            "ReadLac": lambda: pb.ReadLacRequest(ledger_id=self.ledger_id(), fence=fence, master_key=key),
            "WriteLac": lambda: pb.WriteLacRequest(ledger_id=self.ledger_id(), master_key=key,
                                                   last_add_confirmed=entry_id),
            "WaitLac": lambda: pb.WaitLacRequest(ledger_id=self.ledger_id(), previous_lac=self.int64(),
                                                 timeout_ms=self.choice((0, 1, -1, 120_001, -(1 << 31),
                                                                         (1 << 31) - 1))),
            "ReadRange": lambda: pb.ReadRangeRequest(
                ledger_id=self.ledger_id(), first_entry_id=entry_id, last_entry_id=_int64(self.choice((entry_id + 3, RAW))),
                fence=fence, master_key=key, max_bytes_per_message=self.choice((0, 1, -1, 1 << 20, RAW)) % (1 << 31)),
            "NodeInfo": pb.NodeInfoRequest,
        }[method]()
        return method, self.damaged(request.SerializeToString())


@dataclasses.dataclass
class Acknowledged:
    """What the node acknowledged: (ledger, entry) -> payload; the last acknowledged add of an id wins."""

    entries: dict = dataclasses.field(default_factory=dict)
    requests: int = 0

    def check_adds(self, messages: list[bytes], responses: list[pb.AddResponse]) -> None:
        expected = []
        for data in messages:
            try:
                expected.extend(pb.AddRequest.FromString(data).entries)
            except DecodeError:
                expected.append(None)  # answered by one BAD_REQUEST result with ids -1/-1
        results = [r for response in responses for r in _answers(response)]
        assert len(results) == len(expected)
        # Entries of a ledger new to the node are answered once its key is checked, after those of held ledgers
        # sent later: matched by ids, the sends of each (ledger, entry) in order (a ledger's entries are journaled
        # in the order sent). A message that does not decode is answered with ids -1/-1.
        sent: dict[tuple[int, int], collections.deque] = collections.defaultdict(collections.deque)
        for entry in expected:
            sent[(-1, -1) if entry is None else (entry.ledger_id, entry.entry_id)].append(entry)
        for result in results:
            assert result.status in ADD_STATUSES, result
            entry = sent[(result.ledger_id, result.entry_id)].popleft()
            if entry is None:
                assert result.status == pb.BAD_REQUEST
                continue
            if entry.ledger_id == PROTECTED:
                assert result.status != pb.OK, "an add with a wrong key changed the protected ledger"
            if result.status == pb.OK:
                self.entries[(entry.ledger_id, entry.entry_id)] = entry.payload
        self.requests += len(messages)

    def check_call(self, method: str, response) -> None:
        if method == "NodeInfo":
            assert response.node_id
        else:
            assert response.status in CALL_STATUSES, (method, response)
        self.requests += 1


def _answers(response: pb.AddResponse) -> list[pb.AddResult]:
    """One AddResult per entry answered. A response answers either in results or, for requests that asked for
    them (AddRequest.range_results, which damaged bytes may set too), in ranges: never both."""
    assert not (response.results and response.ranges), response
    for answer in response.ranges:
        assert 0 <= answer.last_entry_id - answer.first_entry_id < ADDS_PER_EXAMPLE * 4, answer
    return [pb.AddResult(ledger_id=r.ledger_id, entry_id=entry_id, status=r.status, message=r.message)
            for r in response.ranges for entry_id in range(r.first_entry_id, r.last_entry_id + 1)
            ] or list(response.results)


def raw_calls(channel: grpc.Channel, calls: list[tuple[str, bytes]]) -> list[tuple[str, object]]:
    """Every call in flight at once; ReadRange answers with its last message, after checking them all."""
    pending = []
    for method, data in calls:
        path = f"/ledger.v1.StorageNode/{method}"
        if method == "ReadRange":
            stream = channel.unary_stream(path, request_serializer=None,
                                          response_deserializer=pb.ReadRangeResponse.FromString)
            pending.append((method, stream(data, timeout=30)))
        else:
            unary = channel.unary_unary(path, request_serializer=None,
                                        response_deserializer=METHODS[method].FromString)
            pending.append((method, unary.future(data, timeout=30)))
    answers = []
    for method, call in pending:
        if method == "ReadRange":
            responses = list(call)
            assert responses[-1].done and all(r.status in CALL_STATUSES for r in responses), responses
            answers.append((method, responses[-1]))
        else:
            answers.append((method, call.result()))
    return answers


def write_protected(client: NodeClient) -> None:
    entries = [make_entry(PROTECTED, e, payload_for(PROTECTED, e), key=PROTECTED_KEY)
               for e in range(PROTECTED_ENTRIES)]
    assert {r.status for r in client.add(*entries)} == {pb.OK}


def check_everything_acknowledged(client: NodeClient, acknowledged: Acknowledged) -> None:
    for e in range(PROTECTED_ENTRIES):
        read = client.read(PROTECTED, e)
        assert read.status == pb.OK and read.payload == payload_for(PROTECTED, e)
    for (ledger_id, entry_id), payload in acknowledged.entries.items():
        read = client.read(ledger_id, entry_id)
        assert read.status == pb.OK and read.payload == payload, (ledger_id, entry_id)
    protected = [e for r in client.read_range(PROTECTED, 0, PROTECTED_ENTRIES - 1) for e in r.entries]
    assert [e.payload for e in protected] == [payload_for(PROTECTED, e) for e in range(PROTECTED_ENTRIES)]


def test_ten_thousand_hostile_requests_change_no_acknowledged_entry(start_node, store):
    given_ledgers(store, PASSWORDS)
    node = start_node(None, *NODE_ARGS)
    acknowledged = Acknowledged()
    with NodeClient(node.address) as client:
        write_protected(client)
        add = client.channel.stream_stream("/ledger.v1.StorageNode/Add", request_serializer=None,
                                           response_deserializer=pb.AddResponse.FromString)

        # Generation only: the node's state carries over between examples, so shrinking would replay against a
        # different node state and mostly wander; a failure prints the bytes that reproduce it from a fresh node.
        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(st.binary(min_size=4096, max_size=8192))
        def hostile(data):
            provider = Provider(data)
            messages = [provider.add_message() for _ in range(ADDS_PER_EXAMPLE)]
            calls = [provider.call() for _ in range(CALLS_PER_EXAMPLE)]
            acknowledged.check_adds(messages, list(add(iter(messages), timeout=60)))
            for method, answer in raw_calls(client.channel, calls):
                acknowledged.check_call(method, answer)

        hostile()
        assert acknowledged.requests >= 10_000
        assert node.process.poll() is None, node.log()
        assert len(acknowledged.entries) > 50  # the fuzz did store data, so the check below means something
        check_everything_acknowledged(client, acknowledged)
        # The wrong-key fences fenced nothing: the owner still appends.
        assert client.add(make_entry(PROTECTED, PROTECTED_ENTRIES, b"owner", key=PROTECTED_KEY))[0].status == pb.OK
    node.restart()  # SIGKILL: everything acknowledged was durable
    with NodeClient(node.address) as client:
        check_everything_acknowledged(client, acknowledged)


def test_floods_of_abandoned_streams_and_calls_leave_the_node_serving(start_node, store):
    """Clients that hang up while their adds or fences wait for the fsync, or for the key check of a ledger id
    without metadata, must not take the journal down with them (the group's future was cancelled for everyone, and
    the node never acknowledged again)."""
    given_ledgers(store, PASSWORDS)
    node = start_node(None, *NODE_ARGS)
    with NodeClient(node.address) as client:
        write_protected(client)
    asyncio.run(asyncio.wait_for(_flood(node.address), 60))
    assert node.process.poll() is None, node.log()
    with NodeClient(node.address) as client:
        check_everything_acknowledged(client, Acknowledged())
        assert client.add(make_entry(PROTECTED, PROTECTED_ENTRIES, b"owner", key=PROTECTED_KEY))[0].status == pb.OK
        assert client.node_info().node_id == node.node_id


async def _flood(address: str, streams: int = 300) -> None:
    """Add streams cancelled mid-flight or left half-open, ReadRange streams dropped after one message,
    fences whose deadline passes before their fsync."""
    async with grpc.aio.insecure_channel(address) as channel:
        add = channel.stream_stream("/ledger.v1.StorageNode/Add", request_serializer=None,
                                    response_deserializer=pb.AddResponse.FromString)
        read_range = channel.unary_stream("/ledger.v1.StorageNode/ReadRange", request_serializer=None,
                                          response_deserializer=pb.ReadRangeResponse.FromString)
        fence = channel.unary_unary("/ledger.v1.StorageNode/ReadLac", request_serializer=None,
                                    response_deserializer=pb.ReadLacResponse.FromString)
        junk = pb.AddRequest(entries=[make_entry(10 + i % 7, i, b"flood") for i in range(20)]).SerializeToString()

        async def abandoned_add(i: int) -> None:
            call = add()
            for _ in range(i % 4):
                await call.write(junk)
            if i % 4 and i % 3 == 0:
                answered = len((await call.read()).results)
                assert answered and answered % 20 == 0
            elif i % 5 == 0:
                await call.done_writing()  # half-closed, never read
            call.cancel()

        async def abandoned_read(i: int) -> None:
            call = read_range(pb.ReadRangeRequest(ledger_id=PROTECTED, first_entry_id=0, last_entry_id=MAX_ID - 1,
                                                  max_bytes_per_message=1).SerializeToString())
            await call.read()
            call.cancel()

        async def impatient_fence(i: int) -> None:
            request = pb.ReadLacRequest(ledger_id=1000 + i, fence=True, master_key=FUZZ_KEYS[2])
            try:
                await fence(request.SerializeToString(), timeout=0.0005)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED

        await asyncio.gather(*(abandoned_add(i) for i in range(streams)),
                             *(abandoned_read(i) for i in range(streams // 3)),
                             *(impatient_fence(i) for i in range(streams // 3)))


def test_entry_ids_at_wide_strides_cost_memory_in_proportion_to_what_is_stored(start_node, store):
    """Ids 65,535 apart used to grow the dense index by 65,535 holes (768 KiB) per entry."""
    given_ledgers(store, PASSWORDS)
    node = start_node(None, *NODE_ARGS)
    process = psutil.Process(node.pid)
    with NodeClient(node.address) as client:
        write_protected(client)
        before = process.memory_info().rss
        batch = [make_entry(STRIDED, i * 65_535, b"s", lac=-1) for i in range(400)]
        assert {r.status for r in client.add(*batch)} == {pb.OK}
        grown = process.memory_info().rss - before
        assert grown < 64 << 20, f"the node grew by {grown >> 20} MiB for 400 one-byte entries"
        assert [e.entry_id for r in client.read_range(STRIDED, 0, MAX_ID - 1) for e in r.entries] == \
            [i * 65_535 for i in range(400)]
    poll_until(lambda: node.process.poll() is None, 1, what="the node to be alive")
