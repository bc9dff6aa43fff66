"""Ledger, stream and node metadata kept in ZooKeeper, and the embedded ZooKeeper launcher."""
