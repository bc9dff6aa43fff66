"""The stream benchmark's ceiling source hands Spark rows of the ledger query's columns, read from its records."""
import time

import pyarrow as pa
import pytest

from connector.bench.stream_ceiling import CeilingStreamDataSource, CeilingStreamPartition, append_record
from connector.spark.schema import arrow_schema_of, raw_read_schema


def test_the_ceiling_reads_each_record_as_a_row(tmp_path):
    path = str(tmp_path / "records")
    before = int(time.time() * 1000)
    for payload in (b"entry 0", b"entry 1 ", b"\tentry 2\n", b"", b"x" * 16):
        append_record(path, payload)
    after = int(time.time() * 1000)
    source = CeilingStreamDataSource({"path": path})
    assert source.schema() == raw_read_schema(include_metadata=True)
    reader = source.streamReader(source.schema())
    assert reader.latestOffset() == {"offset": 5}
    (batch,) = reader.read(CeilingStreamPartition(1, 4))
    assert batch.schema == arrow_schema_of(raw_read_schema(include_metadata=True))
    assert batch.column("payload").to_pylist() == [b"entry 1 ", b"\tentry 2\n", b""]
    assert batch.column("_offset").to_pylist() == batch.column("entry_id").to_pylist() == [1, 2, 3]
    times = batch.column("_timestamp").cast(pa.int64()).to_pylist()
    assert all(before * 1000 <= t <= after * 1000 for t in times)


def test_a_payload_longer_than_a_record_holds_is_refused(tmp_path):
    with pytest.raises(ValueError, match="up to 16 bytes"):
        append_record(str(tmp_path / "records"), b"x" * 17)
