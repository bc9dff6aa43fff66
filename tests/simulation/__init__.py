"""A seeded, deterministic simulation of the ledger protocol (DESIGN section 7): the real client ops and
runner over a simulated network and an in-memory metadata store, on a virtual clock. See __main__.py."""
