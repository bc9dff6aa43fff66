"""`ledger soak`: a mixed workload against a nemesis on a local cluster, a JSON-lines history of every
operation, and an independent checker run over that history once every fault has healed (DESIGN section 7,
issue 15). The loopback TCP proxy the nemesis cuts the network with lives here too (proxy.py)."""
