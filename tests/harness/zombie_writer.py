"""A ledger writer in its own process, for SIGSTOP/SIGCONT tests (a writer in a long GC pause).

    python -m tests.harness.zombie_writer METADATA_URI

Creates a ledger (E=3, WQ=3, AQ=2), prints `LEDGER <id>`, then appends `payload-<n>` entries one after
another, printing `ACK <entry id>` after each acknowledgement, until an add fails: then it prints
`FAILED <exception class>` and exits.
"""
from __future__ import annotations

import sys

from connector.client import LedgerClient, LedgerError


def main(uri: str) -> int:
    with LedgerClient(uri, timeout=3.0) as client:
        writer = client.create_ledger(3, 3, 2)
        print(f"LEDGER {writer.ledger_id}", flush=True)
        n = 0
        while True:
            try:
                entry_id = writer.append(f"payload-{n}".encode())
            except LedgerError as exc:
                print(f"FAILED {type(exc).__name__}", flush=True)
                return 0
            print(f"ACK {entry_id}", flush=True)
            n += 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
