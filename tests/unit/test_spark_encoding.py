"""connector/spark/encoding.py: arrow entries are self-describing and about entryBytes each."""
import pyarrow as pa
import pytest

from connector.spark.encoding import EntryBuilder, decode_entry, encode_entry, entries_of, entry_header
from connector.spark.errors import RowTooLargeError, SchemaMismatchError

SCHEMA = pa.schema([("id", pa.int64()), ("s", pa.string())])


def batch(start, n):
    return pa.record_batch([pa.array(range(start, start + n), pa.int64()), pa.array([f"v{i:06d}" * 8 for i in range(start, start + n)])], schema=SCHEMA)


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_entry_round_trip(compression):
    payload = encode_entry(7, [batch(0, 3), batch(3, 2)], compression)
    assert entry_header(payload) == (7, 5)
    rows = decode_entry(payload)
    assert (rows.first_row, rows.row_count) == (7, 5)
    assert pa.Table.from_batches(rows.batches).column("id").to_pylist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("shift", [1, 3, 4, 8])
def test_an_entry_read_where_a_message_put_it_decodes_into_aligned_buffers(shift):
    """A Spark read hands decode_entry a view into the gRPC message (protos/wire.py), at any address: the
    int64 column of an uncompressed entry must not be left at an address that is not a multiple of 8."""
    payload = encode_entry(0, [batch(0, 100)])
    message = bytes(shift) + payload
    rows = decode_entry(memoryview(message)[shift:])
    ids = rows.batches[0].column(0)
    assert ids.to_pylist() == list(range(100))
    assert ids.buffers()[1].address % 8 == 0


def test_not_an_arrow_entry():
    with pytest.raises(SchemaMismatchError, match="not an arrow entry"):
        entry_header(b"x" * 32)
    with pytest.raises(SchemaMismatchError, match="too short"):
        entry_header(b"abc")


def test_builder_cuts_entries_of_about_target_size_and_numbers_rows():
    builder = EntryBuilder(SCHEMA, target_bytes=8 * 1024)
    entries = list(entries_of([batch(0, 1000), batch(1000, 10), batch(1010, 5), batch(1015, 3000)], builder))
    decoded = [decode_entry(e) for e in entries]
    ids = [i for d in decoded for b in d.batches for i in b.column(0).to_pylist()]
    assert ids == list(range(4015))
    assert builder.rows_written == 4015
    expected_first = 0
    for d in decoded:
        assert d.first_row == expected_first
        expected_first += d.row_count
    sizes = [len(e) for e in entries[:-1]]
    assert len(entries) > 10 and max(sizes) < 3 * 8 * 1024 and min(sizes) > 8 * 1024 / 3


def test_builder_casts_compatible_batches_and_rejects_others():
    wide = pa.schema([("id", pa.int64()), ("s", pa.large_string())])
    b = pa.record_batch([pa.array([1], pa.int64()), pa.array(["x"], pa.large_string())], schema=wide)
    entries = list(entries_of([b], EntryBuilder(SCHEMA, 1024)))
    assert decode_entry(entries[0]).batches[0].schema.equals(SCHEMA)
    other = pa.record_batch([pa.array([1])], names=["x"])
    with pytest.raises(SchemaMismatchError, match="columns"):
        list(entries_of([other], EntryBuilder(SCHEMA, 1024)))


def test_empty_input_makes_no_entry():
    assert list(entries_of([batch(0, 0)], EntryBuilder(SCHEMA, 1024))) == []


def big_row_among_small(size: int) -> pa.RecordBatch:
    """100 small rows with one row of `size` bytes at index 50."""
    values = ["x" * 200] * 100
    values[50] = "y" * size
    return pa.record_batch([pa.array(range(100), pa.int64()), pa.array(values)], schema=SCHEMA)


def test_an_entry_over_the_limit_is_cut_again_so_a_large_row_that_fits_alone_is_written():
    """Entries are cut by estimated size: one large row makes its slice's entry large; the builder cuts that
    entry's rows in halves until each entry fits under max_bytes."""
    builder = EntryBuilder(SCHEMA, target_bytes=64 * 1024, max_bytes=100 * 1024)
    entries = list(entries_of([big_row_among_small(90 * 1024)], builder))
    assert max(len(e) for e in entries) <= 100 * 1024
    decoded = [decode_entry(e) for e in entries]
    assert [i for d in decoded for b in d.batches for i in b.column(0).to_pylist()] == list(range(100))
    assert [d.first_row for d in decoded] == [sum(x.row_count for x in decoded[:k]) for k in range(len(decoded))]
    assert builder.rows_written == 100
    unlimited = entries_of([big_row_among_small(90 * 1024)], EntryBuilder(SCHEMA, 64 * 1024))
    assert max(len(e) for e in unlimited) > 100 * 1024   # what the limit cut


def test_a_row_larger_than_an_entry_may_be_fails_naming_its_size_and_the_limit():
    """Issue 16: a 9 MiB cell was taken for failed nodes (NotEnoughNodesError); now it fails before its entry
    is sent, and no entry holding it or a row after it was produced."""
    builder = EntryBuilder(SCHEMA, target_bytes=64 * 1024, max_bytes=100 * 1024)
    produced = []
    with pytest.raises(RowTooLargeError, match=r"row 50 of this task is 1[0-9,]+ bytes .* than the 102,400 bytes"):
        for entry in entries_of([big_row_among_small(120 * 1024)], builder):
            produced.append(decode_entry(entry))
    assert [i for d in produced for b in d.batches for i in b.column(0).to_pylist()] == list(range(50))
