"""The shared node token (--auth-token-file): calls without it, or with another one, are refused with
UNAUTHENTICATED before they touch any data; the health service stays open."""
from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from connector.client import LedgerClient, LedgerError
from protos import ledger_pb2 as pb
from protos.auth import TOKEN_METADATA_KEY
from protos.ledger_pb2_grpc import StorageNodeStub
from storage_node.config import parse_config
from storage_node.errors import ConfigError
from storage_node.security import read_token
from tests.harness.node_client import KEY, PASSWORD, given_ledgers, make_entry

TOKEN = "s3cret-token"
LEDGER = 3


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


def calls(s: StorageNodeStub, metadata) -> dict:
    return {
        "add": lambda: [r.status for m in s.Add(iter([pb.AddRequest(entries=[make_entry(LEDGER, 0, b"x")])]),
                                                 timeout=5, metadata=metadata) for r in m.results],
        "fence": lambda: s.Read(pb.ReadRequest(ledger_id=LEDGER, entry_id=0, fence=True, master_key=KEY),
                                timeout=5, metadata=metadata).status,
        "read_range": lambda: [m.status for m in s.ReadRange(
            pb.ReadRangeRequest(ledger_id=LEDGER, first_entry_id=0, last_entry_id=1), timeout=5, metadata=metadata)],
        "wait_lac": lambda: s.WaitLac(pb.WaitLacRequest(ledger_id=LEDGER, previous_lac=-1, timeout_ms=0),
                                      timeout=5, metadata=metadata).status,
        "info": lambda: s.NodeInfo(pb.NodeInfoRequest(), timeout=5, metadata=metadata).node_id,
    }


def test_calls_without_the_token_are_unauthenticated_and_change_nothing(start_node, store, token_file):
    given_ledgers(store, {LEDGER: PASSWORD})
    node = start_node(None, "--auth-token-file", str(token_file))
    with grpc.insecure_channel(node.address) as channel:
        s = StorageNodeStub(channel)
        for metadata in (None, ((TOKEN_METADATA_KEY, "wrong"),), ((TOKEN_METADATA_KEY, TOKEN + "x"),)):
            for what, call in calls(s, metadata).items():
                with pytest.raises(grpc.RpcError) as refused:
                    call()
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, what
                assert "token" in refused.value.details()
        right = ((TOKEN_METADATA_KEY, TOKEN),)
        # The refused fence fenced nothing and the refused add stored nothing: this normal add is entry 0.
        assert s.Read(pb.ReadRequest(ledger_id=LEDGER, entry_id=0), timeout=5, metadata=right).status == pb.NO_LEDGER
        assert calls(s, right)["add"]() == [pb.OK]
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_ledger_client_with_the_token_writes_and_reads_and_without_it_cannot(start_node, metadata_uri, token_file):
    for _ in range(2):
        start_node(None, "--auth-token-file", str(token_file))
    with LedgerClient(metadata_uri, auth_token=TOKEN) as lc:
        with lc.create_ledger(2, 2, 2) as w:
            w.append(b"with token")
        assert [e.payload for e in lc.open_ledger(w.ledger_id).read(0, 0)] == [b"with token"]
    with LedgerClient(metadata_uri, timeout=2.0) as anonymous:
        with pytest.raises(LedgerError) as refused:
            list(anonymous.open_ledger(w.ledger_id, recover=False).read(0, 0))
        assert "UNAUTHENTICATED" in str(refused.value)


def test_node_refuses_an_empty_token_file_or_half_a_tls_pair(tmp_path, token_file):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    base = ["--data-dir", str(tmp_path / "d"), "--port", "0", "--metadata", "zk://127.0.0.1:2181/x", "--node-id", "n"]
    with pytest.raises(ConfigError, match="go together"):
        parse_config(base + ["--tls-cert", str(token_file)])
    with pytest.raises(ConfigError, match="not a readable file"):
        parse_config(base + ["--auth-token-file", str(tmp_path / "missing")])
    config = parse_config(base + ["--auth-token-file", str(empty)])
    with pytest.raises(ConfigError, match="non-empty"):
        read_token(config)
