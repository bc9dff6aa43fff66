"""An entry too large for the nodes is the caller's error, never a node failure.

Before, the nodes' BAD_REQUEST for an oversized entry counted as a failure of each node that answered: the writer
replaced node after node for it (each replacement refused it alike) until no node was left, then failed with
"start more nodes", its ledger's metadata full of ensemble changes. Now the client refuses an entry over its
max_entry_bytes (the nodes' --max-entry-bytes, 8 MiB on both sides by default) before anything of the call is
sent, and the ledger writes on; and if a node's limit is lower than the client's, the node's refusal fails the
writer at that entry with the node's reason, no node replaced, the entries before it kept.
"""
import pytest

from connector.client import EntryRefusedError, EntryTooLargeError, LedgerClient, Streams
from connector.client.entry_time import FRAME

LIMIT = 8 * 1024 * 1024


def test_an_entry_over_the_limit_is_refused_before_anything_is_sent_and_the_writer_goes_on(cluster, metadata_uri):
    cluster(3)
    with LedgerClient(metadata_uri) as lc:
        with lc.create_ledger(3, 3, 2) as writer:
            assert writer.append(b"first") == 0
            with pytest.raises(EntryTooLargeError, match=r"the entry is 8,388,609 bytes, over the 8,388,608 bytes "
                                                         r".*--max-entry-bytes.*nothing was appended"):
                writer.append(b"x" * (LIMIT + 1))
            with pytest.raises(EntryTooLargeError, match=r"entry 1 of the batch is 8,388,609 bytes"):
                writer.append_many([b"second", b"x" * (LIMIT + 1), b"third"])
            assert writer.append(b"x" * LIMIT) == 1       # the nodes' limit is inclusive
            assert writer.append_many([b"second", b"third"]) == [2, 3]
            assert writer.metadata.fragments[0].first_entry_id == 0 and len(writer.metadata.fragments) == 1
        assert [e.payload[:6] for e in lc.open_ledger(writer.ledger_id).read()] == [b"first", b"xxxxxx", b"second",
                                                                                    b"third"]

        with Streams(lc).open_writer("events") as stream:
            largest = LIMIT - FRAME.size              # the stream writer adds its time frame to each entry
            with pytest.raises(EntryTooLargeError, match="nothing was appended"):
                stream.append_many([b"a", b"x" * (largest + 1)])
            assert stream.append(b"a") == 0
            assert stream.append(b"x" * largest) == 1
        assert [e.payload[:1] for e in Streams(lc).read("events")] == [b"a", b"x"]


def test_an_entry_a_node_refuses_stops_the_writer_without_replacing_any_node(cluster, metadata_uri):
    cluster(4, "--max-entry-bytes", "65536")   # a spare node: a replacement was possible, and must not happen
    with LedgerClient(metadata_uri) as lc:     # the client's limit (8 MiB) above the nodes'
        writer = lc.create_ledger(3, 3, 2)
        ensemble = writer.metadata.fragments[0].ensemble
        assert writer.append(b"kept") == 0
        with pytest.raises(EntryRefusedError, match=r"refused entry 1 of ledger \d+: too large for it; no node is "
                                                    r"replaced .*exceeds this node's limit of 65536 bytes"):
            writer.append(b"x" * 100_000)
        with pytest.raises(EntryRefusedError):
            writer.append(b"small")                # the writer stopped at the refused entry
        closed = writer.close()
        assert closed.last_entry_id == 0
        assert [f.ensemble for f in closed.fragments] == [ensemble]
        assert [e.payload for e in lc.open_ledger(writer.ledger_id).read()] == [b"kept"]


def test_a_limit_no_message_can_carry_is_refused_when_the_client_is_made(metadata_uri):
    from connector.client.limits import MAX_SENDABLE_ENTRY_BYTES
    with pytest.raises(ValueError, match=r"max_entry_bytes must be 1\.\.67,043,328 \(the most one gRPC message"):
        LedgerClient(metadata_uri, max_entry_bytes=MAX_SENDABLE_ENTRY_BYTES + 1)
