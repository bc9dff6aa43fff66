"""Ledger ids from ZooKeeper sequence numbers in buckets (metadata/ledger_ids.py): the pure parts."""
import pytest

from metadata import ledger_ids


def test_a_sequence_number_is_read_only_while_zookeeper_counter_has_not_wrapped():
    assert ledger_ids.sequence_of("/idgen/id-0000000042") == 42
    assert ledger_ids.sequence_of("/idgen/bucket-0000000003/id-2147483647") == 2147483647
    # ZooKeeper formats its signed 32-bit counter with %010d: past 2**31-1 it is negative
    assert ledger_ids.sequence_of("/idgen/id--2147483648") is None
    assert ledger_ids.sequence_of("/idgen/id--000000002") is None


def test_every_id_of_a_bucket_is_below_every_id_of_the_next():
    assert ledger_ids.ledger_id(0, 7) == 7
    assert ledger_ids.ledger_id(0, 2**31 - 1) < ledger_ids.ledger_id(1, 0) == 2**31
    assert ledger_ids.ledger_id(5, 3) == 5 * 2**31 + 3
    with pytest.raises(ValueError):
        ledger_ids.ledger_id(1, 2**31)
    with pytest.raises(ValueError):
        ledger_ids.ledger_id(1, -1)


def test_the_highest_bucket_is_found_among_the_transient_ids_of_the_first():
    assert ledger_ids.highest_bucket([]) == 0
    assert ledger_ids.highest_bucket(["id-0000000012"]) == 0
    assert ledger_ids.highest_bucket(["bucket-0000000001", "id-0000000012", "bucket-0000000010",
                                      "bucket-0000000002", "bucket-x"]) == 10
    assert ledger_ids.bucket_path(0) == "/idgen" and ledger_ids.bucket_path(2) == "/idgen/bucket-0000000002"
