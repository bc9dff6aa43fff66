"""Mutual TLS between clients and storage nodes: the happy path end to end, and every client without a valid
certificate refused before it can write, fence or read; clients refuse nodes they cannot verify."""
from __future__ import annotations

import contextlib

import grpc
import pytest

from connector.client import LedgerClient, LedgerError, TlsConfig
from protos import ledger_pb2 as pb
from protos.ledger_pb2_grpc import StorageNodeStub
from tests.harness.node_client import KEY, PASSWORD, given_ledgers, make_entry

LEDGER = 7


@contextlib.contextmanager
def stub(address: str, tls: TlsConfig | None):
    """A plain synchronous stub: plain text without tls, else TLS with exactly the given files."""
    if tls is None:
        channel = grpc.insecure_channel(address)
    else:
        channel = grpc.secure_channel(address, tls.channel_credentials())
    with channel:
        yield StorageNodeStub(channel)


def attempts(s: StorageNodeStub) -> dict:
    """One write, one fence and one read of each kind; each returns its status or raises RpcError."""
    return {
        "add": lambda: [r.status for m in s.Add(iter([pb.AddRequest(entries=[make_entry(LEDGER, 1, b"intruder")])]),
                                                 timeout=5) for r in m.results],
        "fence": lambda: s.ReadLac(pb.ReadLacRequest(ledger_id=LEDGER, fence=True, master_key=KEY), timeout=5).status,
        "read": lambda: s.Read(pb.ReadRequest(ledger_id=LEDGER, entry_id=0), timeout=5).status,
        "read_range": lambda: [m.status for m in s.ReadRange(
            pb.ReadRangeRequest(ledger_id=LEDGER, first_entry_id=0, last_entry_id=5), timeout=5)],
        "write_lac": lambda: s.WriteLac(pb.WriteLacRequest(ledger_id=LEDGER, master_key=KEY, last_add_confirmed=0),
                                        timeout=5).status,
        "info": lambda: s.NodeInfo(pb.NodeInfoRequest(), timeout=5).node_id,
    }


def test_ledger_client_writes_and_reads_over_mutual_tls(pki, cluster, metadata_uri):
    cluster(3, *pki.node_args())
    with LedgerClient(metadata_uri, tls=pki.client_tls()) as lc:
        with lc.create_ledger(3, 2, 2, password=b"pw") as w:
            for i in range(50):
                w.append(f"entry {i}".encode())
        entries = list(lc.open_ledger(w.ledger_id, password=b"pw").read(0, 49))
    assert [e.payload for e in entries] == [f"entry {i}".encode() for i in range(50)]


def test_clients_without_a_valid_certificate_can_neither_write_fence_nor_read(pki, start_node, store):
    given_ledgers(store, {LEDGER: PASSWORD})
    node = start_node(None, *pki.node_args())
    with stub(node.address, pki.client_tls()) as good:
        [ack] = [r for m in good.Add(iter([pb.AddRequest(entries=[make_entry(LEDGER, 0, b"acknowledged")])]),
                                     timeout=10) for r in m.results]
        assert ack.status == pb.OK
    intruders = {
        "plain text": None,
        "no client certificate": TlsConfig(ca=str(pki.ca.cert)),
        "certificate of another CA": pki.client_tls(pki.other_client),
    }
    for who, tls in intruders.items():
        with stub(node.address, tls) as s:
            for what, attempt in attempts(s).items():
                with pytest.raises(grpc.RpcError) as refused:
                    attempt()
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, (who, what)
    with stub(node.address, pki.client_tls()) as good:
        # Nothing the intruders sent had an effect: not fenced (a normal add is accepted), entry 0 intact.
        assert good.Read(pb.ReadRequest(ledger_id=LEDGER, entry_id=0), timeout=10).payload == b"acknowledged"
        [again] = [r for m in good.Add(iter([pb.AddRequest(entries=[make_entry(LEDGER, 1, b"owner")])]), timeout=10)
                   for r in m.results]
        assert again.status == pb.OK
    assert node.process.poll() is None


@pytest.mark.parametrize("served", ["other_node", "misnamed_node"])
def test_client_refuses_a_node_whose_certificate_it_cannot_verify(pki, start_node, metadata_uri, served):
    """Signed by a CA the client does not trust, or naming another host than the one dialled: no connection."""
    node = start_node(None, *pki.node_args(getattr(pki, served), require_client_cert=False))
    with stub(node.address, pki.client_tls()) as s:
        with pytest.raises(grpc.RpcError) as refused:
            s.NodeInfo(pb.NodeInfoRequest(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    with LedgerClient(metadata_uri, tls=pki.client_tls(), timeout=2.0) as lc:
        with pytest.raises(LedgerError):
            with lc.create_ledger(1, 1, 1) as w:
                w.append(b"must not reach an unverified node")


def test_half_configured_tls_is_refused_with_a_clear_message(pki, tmp_path):
    with pytest.raises(LedgerError, match="go together"):
        TlsConfig(ca=str(pki.ca.cert), cert=str(pki.client.cert))
    with pytest.raises(LedgerError, match="CA bundle"):
        TlsConfig.from_paths(None, str(pki.client.cert), str(pki.client.key))
    with pytest.raises(LedgerError, match="cannot read the CA bundle"):
        TlsConfig(ca=str(tmp_path / "missing.pem")).channel_credentials()


def test_a_client_with_a_missing_tls_file_fails_when_it_is_made(metadata_uri, tmp_path):
    """Not at its first call to a node, which comes later (api.LedgerClient._node_io)."""
    with pytest.raises(LedgerError, match="cannot read the CA bundle"):
        LedgerClient(metadata_uri, tls=TlsConfig(ca=str(tmp_path / "missing.pem")))
