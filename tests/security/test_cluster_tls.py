"""`ledger cluster start --tls` end to end: the local CA and certificates, nodes serving mutual TLS only, and the
client, the admin commands and `cluster status` reaching them with the recorded certificate settings."""
from __future__ import annotations

import json
import subprocess
import sys

import grpc
import pytest

from connector.client import LedgerClient, TlsConfig
from metadata import registry
from metadata.store import MetadataStore
from protos import ledger_pb2 as pb
from protos.ledger_pb2_grpc import StorageNodeStub


def ledger(*args, check=True, env=None):
    result = subprocess.run([sys.executable, "-m", "connector.cli", *args], capture_output=True, text=True,
                            timeout=180, env=env)
    if check and result.returncode != 0:
        raise AssertionError(f"ledger {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def test_cluster_start_tls_serves_mutual_tls_to_clients_with_the_recorded_certificates(tmp_path, capsys):
    directory = tmp_path / "cluster"
    uri = ledger("cluster", "start", "--nodes", "2", "--tls", "--dir", str(directory)).stdout.strip()
    try:
        recorded = json.loads((directory / "cluster.json").read_text())["tls"]
        assert all((directory / "tls").samefile(p.rsplit("/", 1)[0]) for p in recorded.values())
        tls = TlsConfig(ca=recorded["ca"], cert=recorded["client_cert"], key=recorded["client_key"])

        with LedgerClient(uri, tls=tls) as lc:
            with lc.create_ledger(2, 2, 2) as w:
                w.append(b"over tls")
            ledger_id = w.ledger_id
            assert [e.payload for e in lc.open_ledger(ledger_id).read(0, 0)] == [b"over tls"]

        with MetadataStore(uri) as store:
            address = next(iter(registry.list_nodes(store).values())).address
        with grpc.insecure_channel(address) as plain, pytest.raises(grpc.RpcError):
            StorageNodeStub(plain).Read(pb.ReadRequest(ledger_id=ledger_id, entry_id=0), timeout=5)

        status = ledger("cluster", "status", "--dir", str(directory)).stdout
        assert "tls        on (mutual)" in status and status.count(" up ") == 2

        flags = ["--metadata", uri, "--tls-ca", tls.ca, "--tls-cert", tls.cert, "--tls-key", tls.key]
        assert ledger("read", str(ledger_id), *flags).stdout == "0\tover tls\n"
        refused = ledger("read", str(ledger_id), "--metadata", uri, "--no-recover", check=False)
        assert refused.returncode == 1 and "ledger: error:" in refused.stderr
        half = ledger("read", str(ledger_id), "--metadata", uri, "--tls-cert", tls.cert, check=False)
        assert half.returncode == 1 and "CA bundle" in half.stderr

        # A restart without --tls keeps TLS on: cluster.json remembers it.
        ledger("cluster", "stop", "--dir", str(directory))
        ledger("cluster", "start", "--dir", str(directory))
        with LedgerClient(uri, tls=tls) as lc:
            assert [e.payload for e in lc.open_ledger(ledger_id).read(0, 0)] == [b"over tls"]
    finally:
        ledger("cluster", "stop", "--dir", str(directory), check=False)
