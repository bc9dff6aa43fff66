"""A small synchronous gRPC client for talking to one storage node in tests."""
from __future__ import annotations

from typing import Mapping

import grpc

from metadata import layout, serde
from metadata.model import Fragment, LedgerMetadata
from protos import ledger_pb2 as pb
from protos import ledger_pb2_grpc
from protos.digest import entry_digest, master_key, password_hash

PASSWORD = b"test-password"
KEY = master_key(PASSWORD)
OTHER_KEY = master_key(b"another-password")
_MAX_MESSAGE = 256 << 20


def make_entry(ledger_id: int, entry_id: int, payload: bytes, *, key: bytes = KEY, lac: int | None = None,
               recovery: bool = False, digest: int | None = None) -> pb.AddEntry:
    lac = entry_id - 1 if lac is None else lac
    return pb.AddEntry(
        ledger_id=ledger_id, entry_id=entry_id, master_key=key, last_add_confirmed=lac, payload=payload,
        flags=pb.RECOVERY_ADD if recovery else pb.ADD_FLAG_NONE,
        digest=entry_digest(ledger_id, entry_id, lac, payload) if digest is None else digest,
    )


def payload_for(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    """Distinct, reproducible payload bytes for an entry."""
    seed = f"{ledger_id}:{entry_id}:".encode()
    return (seed * (size // len(seed) + 1))[:size]


class NodeClient:
    def __init__(self, address: str):
        self.address = address
        self.channel = grpc.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE), ("grpc.max_send_message_length", _MAX_MESSAGE),
        ])
        self.stub = ledger_pb2_grpc.StorageNodeStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "NodeClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add_batches(self, batches: list[list[pb.AddEntry]], timeout: float = 60.0) -> dict[tuple[int, int], pb.AddResult]:
        """Send every batch as one AddRequest on one stream; results keyed by (ledger id, entry id)."""
        requests = [pb.AddRequest(entries=batch) for batch in batches]
        results = {}
        for response in self.stub.Add(iter(requests), timeout=timeout):
            for result in response.results:
                results[(result.ledger_id, result.entry_id)] = result
        return results

    def add(self, *entries: pb.AddEntry) -> list[pb.AddResult]:
        """Add entries in one message; results in the order of the entries."""
        results = self.add_batches([list(entries)])
        return [results[(e.ledger_id, e.entry_id)] for e in entries]

    def read(self, ledger_id: int, entry_id: int, *, fence: bool = False, key: bytes = b"") -> pb.ReadResponse:
        return self.stub.Read(pb.ReadRequest(ledger_id=ledger_id, entry_id=entry_id, fence=fence, master_key=key),
                              timeout=30)

    def read_range(self, ledger_id: int, first: int, last: int, **fields) -> list[pb.ReadRangeResponse]:
        request = pb.ReadRangeRequest(ledger_id=ledger_id, first_entry_id=first, last_entry_id=last, **fields)
        return list(self.stub.ReadRange(request, timeout=60))

    def read_lac(self, ledger_id: int, *, fence: bool = False, key: bytes = b"") -> pb.ReadLacResponse:
        return self.stub.ReadLac(pb.ReadLacRequest(ledger_id=ledger_id, fence=fence, master_key=key), timeout=30)

    def write_lac(self, ledger_id: int, lac: int, key: bytes = KEY) -> pb.WriteLacResponse:
        return self.stub.WriteLac(
            pb.WriteLacRequest(ledger_id=ledger_id, master_key=key, last_add_confirmed=lac), timeout=30
        )

    def wait_lac(self, ledger_id: int, previous_lac: int, timeout_ms: int) -> pb.ReadLacResponse:
        return self.stub.WaitLac(
            pb.WaitLacRequest(ledger_id=ledger_id, previous_lac=previous_lac, timeout_ms=timeout_ms),
            timeout=timeout_ms / 1000 + 30,
        )

    def wait_lac_future(self, ledger_id: int, previous_lac: int, timeout_ms: int) -> grpc.Future:
        return self.stub.WaitLac.future(
            pb.WaitLacRequest(ledger_id=ledger_id, previous_lac=previous_lac, timeout_ms=timeout_ms),
            timeout=timeout_ms / 1000 + 30,
        )

    def node_info(self) -> pb.NodeInfoResponse:
        return self.stub.NodeInfo(pb.NodeInfoRequest(), timeout=30)

    def raw(self, method: str, data: bytes, response_type):
        """Call a unary method with arbitrary bytes as the request (malformed-request tests)."""
        call = self.channel.unary_unary(
            f"/ledger.v1.StorageNode/{method}", request_serializer=lambda b: b,
            response_deserializer=response_type.FromString,
        )
        return call(data, timeout=30)

    def raw_add(self, messages: list[bytes]) -> list[pb.AddResponse]:
        call = self.channel.stream_stream(
            "/ledger.v1.StorageNode/Add", request_serializer=lambda b: b,
            response_deserializer=pb.AddResponse.FromString,
        )
        return list(call(iter(messages), timeout=30))


def given_ledgers(store, passwords: Mapping[int, bytes]) -> None:
    """Metadata for each ledger id of passwords (an OPEN ledger on node-1 alone), naming its password: a node that
    checks master keys against the metadata (storage_node/key_check.py) then binds master_key(password) to it.
    Created at the ids given, as no client creates ledgers: for tests that drive nodes with fixed ledger ids."""
    create = store.transaction()
    for ledger_id, password in passwords.items():
        meta = LedgerMetadata(ledger_id, 1, 1, 1, (Fragment(0, ("node-1",)),), password_hash=password_hash(password))
        create.create(layout.ledger_path(ledger_id), serde.encode_ledger(meta))
    create.commit()


def open_ledger_on_nodes(store, nodes, entries: int, password: bytes, writer_id: str, lacs=()) -> int:
    """An OPEN ledger of writer_id on an ensemble of nodes (E = WQ = 3, AQ = 2), whose `entries` entries every node
    holds, each piggybacking LAC -1 as a pipelined writer sends them before any completes; lacs: the explicit LAC
    each node then takes, in the order of nodes (none: they know -1). Its id."""
    meta = LedgerMetadata(0, 3, 3, 2, (Fragment(0, tuple(n.node_id for n in nodes)),),
                          password_hash=password_hash(password), writer_id=writer_id)
    ledger_id = store.create_ledger(meta).value.ledger_id
    key = master_key(password)
    batch = [make_entry(ledger_id, e, payload_for(ledger_id, e), key=key, lac=-1) for e in range(entries)]
    for node in nodes:
        with NodeClient(node.address) as nc:
            assert all(r.status == pb.OK for r in nc.add(*batch))
    for node, lac in zip(nodes, lacs):
        with NodeClient(node.address) as nc:
            assert nc.write_lac(ledger_id, lac).status == pb.OK
    return ledger_id
