"""A streaming query's checkpoint read without Spark (connector/checkpoint.py): an offsets file it cannot read is
one line naming the file, the line and what to check, never a traceback."""
import json

import pytest

from connector.checkpoint import CheckpointError, SourceOffset, read_checkpoint
from connector.cli import main

META = '{"batchWatermarkMs":0,"batchTimestampMs":0}'


def checkpoint(tmp_path, offsets: bytes):
    (tmp_path / "offsets").mkdir(parents=True)
    (tmp_path / "commits").mkdir()
    (tmp_path / "offsets" / "0").write_bytes(offsets)
    (tmp_path / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    return tmp_path


def test_both_formats_give_each_source_its_offset(tmp_path):
    line = json.dumps({"offset": 7, "stream": "events"})
    assert read_checkpoint(str(checkpoint(tmp_path / "v1", f"v1\n{META}\n{line}\n-\n".encode()))).committed == (
        SourceOffset("0", "events", 7), SourceOffset("1", None, None))
    assert read_checkpoint(str(checkpoint(tmp_path / "v2", f"v2\n{META}\nsrc:{line}\n".encode()))).committed == (
        SourceOffset("src", "events", 7),)


@pytest.mark.parametrize("offsets, why", [
    (f"v2\n{META}\nsrc:-\n12345\n".encode(), "line 4: '12345' is not SOURCE:OFFSET"),
    (b"v1\n\xff\xfe\n", "byte 3: not UTF-8 text"),
    (b"", "it is empty"),
    (b"PK\x03\x04 zip\n", "line 1: 'PK\\x03\\x04 zip'"),
    # an audit's: a lag from a negative offset was computed and printed as if it were one
    (f'v1\n{META}\n{{"offset": -5, "stream": "events"}}\n'.encode(), "line 3: offset -5 is not a stream offset"),
    (f'v2\n{META}\nsrc:{{"offset": true, "stream": "events"}}\n'.encode(), "line 3: offset True is not a stream"),
])
def test_an_offsets_file_it_cannot_read_names_the_file_the_line_and_what_to_check(tmp_path, capsys, offsets, why):
    location = checkpoint(tmp_path, offsets)
    with pytest.raises(CheckpointError) as refused:
        read_checkpoint(str(location))
    assert str(refused.value).startswith(f"{location / 'offsets' / '0'} is not a Spark offsets file this command "
                                         f"reads ({why}")
    assert str(refused.value).endswith("; check that --checkpoint is the query's checkpointLocation")
    # The command reads the checkpoint before it opens a client: no ZooKeeper needed to see the one line.
    assert main(["stream", "lag", "--checkpoint", str(location), "--metadata", "zk://127.0.0.1:1/l"]) == 1
    assert capsys.readouterr().err == f"ledger: error: {refused.value}\n"
