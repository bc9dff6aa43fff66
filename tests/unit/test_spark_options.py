"""connector/spark/options.py: parsed once, every error names the option and its allowed values."""
import pytest

from connector.spark.errors import InvalidOptionError
from connector.spark.options import LedgerOptions
from metadata.model import Retention

URI = "zk://127.0.0.1:2181/ledgers"


def parse(**options):
    return LedgerOptions.parse({"metadata": URI, **{k.lower(): v for k, v in options.items()}})


def test_defaults():
    opts = parse(path="events")
    assert (opts.stream, opts.ensemble_size, opts.write_quorum, opts.ack_quorum) == ("events", 3, 3, 2)
    assert opts.recover and not opts.include_metadata and opts.compression is None
    assert (opts.starting_offset, opts.ending_offset, opts.split_entries) == (None, None, 0)
    assert opts.max_partition_bytes == 32 * 1024 * 1024


def test_metadata_defaults_to_environment(monkeypatch):
    monkeypatch.setenv("LEDGER_METADATA", "zk://10.0.0.1:2181/prod")
    assert LedgerOptions.parse({"path": "events"}).metadata == "zk://10.0.0.1:2181/prod"
    monkeypatch.delenv("LEDGER_METADATA")
    assert LedgerOptions.parse({"path": "events"}).metadata == URI


def test_values_are_parsed_case_insensitively():
    opts = parse(path="e", ensembleSize="5", writeQuorum="3", ackQuorum="2", entryBytes="65536", compression="ZSTD",
                 startingOffsets="10", endingOffsets="20", includeMetadata="TRUE", splitEntries="4", recover="false",
                 password="secret", maxPartitionBytes="0")
    assert (opts.ensemble_size, opts.entry_bytes, opts.compression) == (5, 65536, "zstd")
    assert opts.max_partition_bytes == 0
    assert (opts.starting_offset, opts.ending_offset, opts.split_entries) == (10, 20, 4)
    assert opts.include_metadata and not opts.recover and opts.password == b"secret"


def test_ledgers_option():
    assert parse(ledgers="3, 1,2").ledgers == (3, 1, 2)


@pytest.mark.parametrize(
    "options, expected",
    [
        ({"ensembleSize": "2"}, "ensembleSize >= writeQuorum >= ackQuorum"),
        ({"ackQuorum": "0"}, "ackQuorum='0': allowed values are integers >= 1"),
        ({"compression": "gzip"}, "compression='gzip': allowed values are none, lz4, zstd"),
        ({"recover": "yes"}, "recover='yes': allowed values are true, false"),
        ({"entryBytes": "10"}, "entryBytes='10': allowed values are integers 1024.."),
        ({"startingOffsets": "latest"}, "startingOffsets='latest': allowed values are earliest or"),
        ({"endingOffsets": "-3"}, "endingOffsets='-3': allowed values are latest or"),
        ({"startingOffsets": "9", "endingOffsets": "3"}, "endingOffsets=3 is before startingOffsets=9"),
        ({"view": "nodes"}, "view='nodes': allowed values are ledgers"),
        ({"maxPartitionBytes": "-1"}, "maxPartitionBytes='-1': allowed values are integers >= 0"),
        ({"speculativeReadTimeoutMs": "0.5"}, "speculativeReadTimeoutMs='0.5': allowed values are integers >= 0"),
        ({"colour": "red"}, "unknown option(s) colour"),
        ({"path": "bad name"}, "option path (the stream name)"),
        ({"metadata": "http://x"}, "option metadata"),
        # kazoo's "ValueError: relative paths not allowed" reached the user (an audit's)
        ({"metadata": "zk://127.0.0.1:2181/ledgers/../ledgers"},
         "option metadata: metadata URI 'zk://127.0.0.1:2181/ledgers/../ledgers': its root /ledgers/../ledgers has a "
         "'.' or '..' segment"),
    ],
)
def test_bad_values_name_the_option(options, expected):
    with pytest.raises(InvalidOptionError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        parse(**{"path": "events", **options})


def test_the_speculative_read_timeout_reaches_every_client_the_connector_opens():
    assert parse(path="e").client_options()["speculative_read_timeout"] == 0.5
    opts = parse(path="e", speculativeReadTimeoutMs="150")
    assert opts.client_options()["speculative_read_timeout"] == 0.15
    assert opts.task_client_options()["speculative_read_timeout"] == 0.15
    assert parse(path="e", speculativeReadTimeoutMs="0").client_options()["speculative_read_timeout"] == 0


def test_bad_ledger_ids():
    with pytest.raises(InvalidOptionError, match="ledgers='1,x'"):
        parse(ledgers="1,x")
    with pytest.raises(InvalidOptionError, match="both a stream"):
        parse(path="events", ledgers="1")
    with pytest.raises(InvalidOptionError, match="cannot be used with the ledgers option"):
        parse(ledgers="1", startingOffsets="3")


def test_read_and_write_requirements():
    with pytest.raises(InvalidOptionError, match="nothing to read"):
        parse().check_readable()
    parse(view="ledgers").check_readable()
    with pytest.raises(InvalidOptionError, match="nothing to write to"):
        parse().check_writable()
    with pytest.raises(InvalidOptionError, match="startingOffsets/endingOffsets are for reading"):
        parse(path="e", startingOffsets="1").check_writable()
    parse(path="e").check_writable()


def test_the_view_refuses_the_options_it_would_ignore():
    """Spark read audit 2026-11-29: view=ledgers with ledgers="12" listed every ledger of the cluster; the offset,
    time and includeMetadata options were ignored as silently."""
    parse(view="ledgers", path="events").check_readable()
    with pytest.raises(InvalidOptionError, match="view=ledgers lists ledgers' metadata .* takes no ledgers; remove it"):
        parse(view="ledgers", ledgers="12").check_readable()
    with pytest.raises(InvalidOptionError, match="takes no includeMetadata, startingOffsets/endingOffsets; remove them"):
        parse(view="ledgers", path="events", includeMetadata="true", startingOffsets="3").check_readable()


def test_fail_on_data_loss_is_a_read_option_of_batch_reads_too():
    assert parse(path="e").fail_on_data_loss is True
    assert parse(path="e", failOnDataLoss="FALSE").fail_on_data_loss is False
    with pytest.raises(InvalidOptionError, match="option failOnDataLoss='no': allowed values are true, false"):
        parse(path="e", failOnDataLoss="no")


def test_retention_options_are_stored_by_a_write_and_refused_by_a_read():
    opts = parse(path="e", retentionMs="604800000", retentionBytes="1000")
    opts.check_writable()
    assert opts.retention(Retention()) == Retention(max_age=604800.0, max_bytes=1000)
    assert parse(path="e", retentionMs="-1").retention(Retention(60, 100)) == Retention(max_bytes=100)
    assert parse(path="e").retention(Retention(60, 100)) == Retention(60, 100)
    with pytest.raises(InvalidOptionError, match=r"option retentionMs='7d': allowed values are integers >= 1 "
                                                 r"\(milliseconds\), or -1 to remove the stream's limit"):
        parse(path="e", retentionMs="7d")
    with pytest.raises(InvalidOptionError, match=r"option retentionBytes='0'.*retentionBytes=107374182400"):
        parse(path="e", retentionBytes="0")
    with pytest.raises(InvalidOptionError, match="retentionMs/retentionBytes set a stream's retention when writing"):
        parse(path="e", retentionMs="1000").check_readable()
