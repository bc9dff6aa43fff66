"""The main job on the embedded default: a local cluster, ledgers written and read through the nodes.

`python -m connector.demo [--dir DIR] [--entries N]` starts ZooKeeper and three storage nodes, writes
a striped ledger, reads it back, leaves a second ledger dangling as a crashed writer would, recovers
it from another client, prints what happened, and stops the cluster.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time

from connector.client import LedgerClient
from connector.cluster import LocalCluster


def payload(i: int) -> bytes:
    return f"event {i:08d} ".encode() + hashlib.sha256(str(i).encode()).digest() * 4


def run(directory: str, entries: int) -> int:
    print(f"starting ZooKeeper and 3 storage nodes in {directory} ...")
    with LocalCluster(directory, nodes=3) as cluster:
        print(f"metadata: {cluster.metadata_uri}")
        with LedgerClient(cluster.metadata_uri) as client:
            started = time.monotonic()
            with client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2) as writer:
                futures = [writer.append_async(payload(i)) for i in range(entries)]
                assert [f.result() for f in futures] == list(range(entries))
                ledger_id = writer.ledger_id
            took = time.monotonic() - started
            meta = client.ledger_metadata(ledger_id)
            print(f"wrote ledger {ledger_id}: {entries} entries striped over {meta.fragments[0].ensemble} "
                  f"(E=3, WQ=2, AQ=2) in {took:.2f}s; state {meta.state.value}, last entry {meta.last_entry_id}")

            reader = client.open_ledger(ledger_id)
            read_back = [e.payload for e in reader.read(0, reader.last_entry_id)]
            intact = read_back == [payload(i) for i in range(entries)]
            print(f"read back {len(read_back)} entries, every digest verified, content identical: {intact}")

            dangling = client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
            acknowledged = [dangling.append(payload(i)) for i in range(100)]
            print(f"ledger {dangling.ledger_id}: writer acknowledged entries 0..{acknowledged[-1]} "
                  "and then stopped without closing (as a crashed writer would)")
            with LedgerClient(cluster.metadata_uri) as other:
                recovered = other.open_ledger(dangling.ledger_id, recover=True)
                print(f"another client fenced and recovered it: CLOSED at last entry {recovered.last_entry_id}, "
                      f"nothing acknowledged lost: {recovered.last_entry_id >= acknowledged[-1]}")
            try:
                dangling.append(b"too late")
                fenced = False
            except Exception as exc:  # the fenced writer's next add must fail
                fenced = True
                print(f"the old writer's next append fails: {type(exc).__name__}: {exc}")
        ok = intact and fenced and recovered.last_entry_id >= acknowledged[-1]
    print("stopped the cluster;", "all checks passed" if ok else "CHECKS FAILED")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="cluster directory (default: a temporary directory)")
    parser.add_argument("--entries", type=int, default=10_000)
    args = parser.parse_args(argv)
    if args.dir:
        return run(args.dir, args.entries)
    with tempfile.TemporaryDirectory(prefix="ledger-demo-") as directory:
        return run(directory, args.entries)


if __name__ == "__main__":
    sys.exit(main())
