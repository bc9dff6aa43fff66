"""Data source options: parsed and validated once, into one small picklable value.

Spark hands the options over lower-cased; every error names the option as the user spells it and
lists the allowed values.

Time (Kafka's names and meanings): startingTimestamp (batch and streaming reads) starts at the stream's first
offset whose append time is at or after it, endingTimestamp (batch reads) ends before the first offset at or
after it; both in milliseconds since the epoch. startingOffsetsByTimestampStrategy says what happens when no
offset is at or after startingTimestamp: error (the default, as Kafka's) fails the read, latest starts at the
stream's end. When no offset is at or after endingTimestamp, the read goes to the end (Kafka's latest).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable, Mapping

from connector.client import default_metadata_uri
from connector.client.limits import DEFAULT_MAX_ENTRY_BYTES, MAX_SENDABLE_ENTRY_BYTES
from connector.client.ops.read import DEFAULT_SPECULATIVE_READ_TIMEOUT
from connector.client.security import TlsConfig, read_token_file
from connector.spark.errors import InvalidOptionError
from metadata.errors import LedgerError
from metadata.model import Retention
from metadata.store import MetadataUri, zk_wait_seconds
from metadata.streams import check_stream_name

COMPRESSIONS = ("none", "lz4", "zstd")
TIMESTAMP_STRATEGIES = ("error", "latest")
VIEWS = ("ledgers",)
MIN_ENTRY_BYTES = 1024
MAX_ENTRY_BYTES = 4 * 1024 * 1024  # well under a storage node's default --max-entry-bytes (8 MiB)
# startingTimestamp/endingTimestamp under this are seconds mistaken for milliseconds: as milliseconds they are
# before 1973-03-03, before anything was appended; as seconds the bound is the year 5138.
SECONDS_BELOW = 10 ** 11
# startingTimestamp/endingTimestamp: the last millisecond of year 9999, the last a date (Python's, Spark's) can show.
MAX_TIMESTAMP_MS = 253402300799999

# lower-case key -> the spelling used in documentation and error messages
SPELLING = {
    name.lower(): name
    for name in (
        "path", "metadata", "ledgers", "recover", "password", "ensembleSize", "writeQuorum", "ackQuorum",
        "entryBytes", "maxEntryBytes", "compression", "startingOffsets", "endingOffsets", "includeMetadata",
        "splitEntries", "maxPartitionBytes", "view",
        "tlsCa", "tlsCert", "tlsKey", "authTokenFile", "failOnDataLoss", "retentionMs", "retentionBytes",
        "startingTimestamp", "endingTimestamp", "startingOffsetsByTimestampStrategy", "speculativeReadTimeoutMs",
    )
}


@dataclasses.dataclass(frozen=True)
class LedgerOptions:
    metadata: str = dataclasses.field(repr=False)  # may carry ZooKeeper credentials (zk://user:secret@...)
    stream: str | None = None
    ledgers: tuple[int, ...] = ()
    recover: bool = True
    password: bytes = dataclasses.field(default=b"", repr=False)
    ensemble_size: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    entry_bytes: int = 1024 * 1024
    # writes: the storage nodes' --max-entry-bytes; an entry is cut below it, a row that alone is larger fails
    max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES
    compression: str | None = None
    starting_offset: int | None = None  # inclusive; None = earliest
    ending_offset: int | None = None  # exclusive; None = latest
    include_metadata: bool = False
    split_entries: int = 0  # entries per read partition; 0 = one partition per ledger
    # reads and micro-batches: runs of small ledgers share a partition up to this many bytes (planning.py); 0 = never
    max_partition_bytes: int = 32 * 1024 * 1024
    view: str | None = None
    # PEM files and the token file for storage nodes with TLS / --auth-token-file; paths, so every executor
    # must see the same files (the driver checks that they exist).
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    auth_token_file: str | None = None
    # reads: fail (true) or skip with a warning (false) when offsets asked for are gone (data_loss.py)
    fail_on_data_loss: bool = True
    # writes: the stream's retention, stored by the commit (None: keep the stream's; -1: remove that limit)
    retention_ms: int | None = None
    retention_bytes: int | None = None
    # reads: append times (ms since the epoch) that become offsets when the read is planned (time_search.py)
    starting_timestamp: int | None = None   # inclusive, like startingOffsets
    ending_timestamp: int | None = None     # exclusive, like endingOffsets
    timestamp_strategy: str = "error"       # no offset at or after startingTimestamp: error | latest
    # reads: ask another replica as well when a node has not answered for this long (LedgerClient's
    # speculative_read_timeout); 0 = never
    speculative_read_timeout_ms: int = round(DEFAULT_SPECULATIVE_READ_TIMEOUT * 1000)

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: Mapping[str, str] | None = None) -> "LedgerOptions":
        """streaming: the spelling of the streaming options (stream_options.py), taken off options before, for the
        list of known options an unknown one is answered with."""
        given = {str(k).lower(): v for k, v in options.items() if v is not None}
        unknown = sorted(set(given) - set(SPELLING))
        if unknown:
            known = sorted({*SPELLING.values(), *(streaming or {}).values()}, key=str.lower)
            raise InvalidOptionError(
                f"unknown option(s) {', '.join(unknown)}; the ledger data source knows {', '.join(known)}"
            )
        # Each parser answers None for an option that is not given, and a None is left out: the option keeps
        # its field's default, written once, above.
        values = dict(
            stream=_stream(given.get("path")),
            ledgers=_ledger_ids(given.get("ledgers")),
            recover=_boolean(given, "recover"),
            password=given["password"].encode() if "password" in given else None,
            ensemble_size=integer_option(given, "ensemblesize", minimum=1),
            write_quorum=integer_option(given, "writequorum", minimum=1),
            ack_quorum=integer_option(given, "ackquorum", minimum=1),
            entry_bytes=integer_option(given, "entrybytes", minimum=MIN_ENTRY_BYTES, maximum=MAX_ENTRY_BYTES),
            max_entry_bytes=integer_option(given, "maxentrybytes", minimum=MIN_ENTRY_BYTES,
                                           maximum=MAX_SENDABLE_ENTRY_BYTES),
            compression=_choice(given, "compression", COMPRESSIONS),
            starting_offset=offset_option(given, "startingoffsets", ("earliest",)),
            ending_offset=offset_option(given, "endingoffsets", ("latest",)),
            include_metadata=_boolean(given, "includemetadata"),
            split_entries=integer_option(given, "splitentries", minimum=0),
            max_partition_bytes=integer_option(given, "maxpartitionbytes", minimum=0),
            view=_choice(given, "view", VIEWS),
            tls_ca=_file(given, "tlsca"),
            tls_cert=_file(given, "tlscert"),
            tls_key=_file(given, "tlskey"),
            auth_token_file=_file(given, "authtokenfile"),
            fail_on_data_loss=_boolean(given, "failondataloss"),
            retention_ms=_limit(given, "retentionms", "milliseconds"),
            retention_bytes=_limit(given, "retentionbytes", "bytes"),
            starting_timestamp=_timestamp(given, "startingtimestamp"),
            ending_timestamp=_timestamp(given, "endingtimestamp"),
            timestamp_strategy=_choice(given, "startingoffsetsbytimestampstrategy", TIMESTAMP_STRATEGIES),
            speculative_read_timeout_ms=integer_option(given, "speculativereadtimeoutms", minimum=0),
        )
        parsed = cls(metadata=_metadata(given.get("metadata") or default_metadata_uri()),
                     **{name: value for name, value in values.items() if value is not None})
        parsed.client_options()  # refuses half a TLS setting or an unusable token file now, on the driver
        parsed._check_quorums()
        parsed._check_offsets()
        parsed._check_times(given)
        parsed._check_source()
        return parsed

    def client_options(self) -> dict:
        """Keyword arguments for every LedgerClient the connector opens (driver and executors)."""
        try:
            return {
                "tls": TlsConfig.from_paths(self.tls_ca, self.tls_cert, self.tls_key),
                "auth_token": read_token_file(self.auth_token_file) if self.auth_token_file else None,
                "max_entry_bytes": self.max_entry_bytes,
                "speculative_read_timeout": self.speculative_read_timeout_ms / 1000,
            }
        except LedgerError as exc:
            raise InvalidOptionError(f"options tlsCa/tlsCert/tlsKey/authTokenFile: {exc}") from exc

    def task_client_options(self) -> dict:
        """client_options for an executor's task: its client waits for an unreachable ZooKeeper as long as any
        metadata call does ($LEDGER_ZK_WAIT_SECONDS), not a client's 15 s connect timeout, so a task started
        during a ZooKeeper restart rides it out instead of failing its job (or killing its streaming query).
        The driver keeps the short timeout: a wrong URI there fails the job at once."""
        return dict(self.client_options(), connect_timeout=zk_wait_seconds())

    def _check_quorums(self) -> None:
        if not self.ensemble_size >= self.write_quorum >= self.ack_quorum >= 1:
            raise InvalidOptionError(
                f"ensembleSize={self.ensemble_size}, writeQuorum={self.write_quorum}, ackQuorum={self.ack_quorum}: "
                "they must satisfy ensembleSize >= writeQuorum >= ackQuorum >= 1"
            )

    def _check_offsets(self) -> None:
        if self.starting_offset is not None and self.ending_offset is not None:
            if self.ending_offset < self.starting_offset:
                raise InvalidOptionError(
                    f"endingOffsets={self.ending_offset} is before startingOffsets={self.starting_offset}; "
                    "endingOffsets is exclusive and must be >= startingOffsets"
                )
        if self.ledgers and (self.starting_offset is not None or self.ending_offset is not None):
            raise InvalidOptionError(
                "startingOffsets/endingOffsets are stream offsets; they cannot be used with the ledgers option"
            )

    def _check_times(self, given: Mapping[str, str]) -> None:
        """One start and one end each, in order, and only where there are stream offsets to find."""
        check_one_start(given)
        if self.ending_timestamp is not None and "endingoffsets" in given:
            raise InvalidOptionError(
                "both endingOffsets and endingTimestamp are given; they say the same thing (where the read ends): "
                "give one of them"
            )
        starting, ending = self.starting_timestamp, self.ending_timestamp
        if starting is not None and ending is not None and ending < starting:
            raise InvalidOptionError(
                f"endingTimestamp={ending} is before startingTimestamp={starting}; endingTimestamp is exclusive and "
                "must be >= startingTimestamp (both in milliseconds since the epoch)"
            )
        if self.ledgers and (starting is not None or ending is not None):
            raise InvalidOptionError(
                "startingTimestamp/endingTimestamp find stream offsets; they cannot be used with the ledgers option"
            )

    @property
    def has_times(self) -> bool:
        return self.starting_timestamp is not None or self.ending_timestamp is not None

    def _check_source(self) -> None:
        if self.ledgers and self.stream:
            raise InvalidOptionError(
                f"both a stream ({self.stream!r}) and the ledgers option are given; use one of them"
            )

    def check_readable(self) -> None:
        if self.view is None and not self.stream and not self.ledgers:
            raise InvalidOptionError(
                "nothing to read: give a stream name (load(\"events\")) or the ledgers option (\"12,13\")"
            )
        if self.retention_ms is not None or self.retention_bytes is not None:
            raise InvalidOptionError(
                "retentionMs/retentionBytes set a stream's retention when writing; remove them from the read "
                "(or set it with `ledger stream retention NAME`)"
            )
        if self.view is not None:
            ignored = [name for name, given in (
                ("ledgers", self.ledgers), ("includeMetadata", self.include_metadata),
                ("startingOffsets/endingOffsets", self.starting_offset is not None or self.ending_offset is not None),
                ("startingTimestamp/endingTimestamp", self.has_times)) if given]
            if ignored:
                raise InvalidOptionError(
                    f"view={self.view} lists ledgers' metadata (every ledger, or a stream's given as the path) and "
                    f"takes no {', '.join(ignored)}; remove {'it' if len(ignored) == 1 else 'them'}, or filter the "
                    "view's rows (e.g. .where(\"ledger_id in (12, 13)\"))"
                )

    def retention(self, current: Retention) -> Retention:
        """The stream's retention once this write's retentionMs / retentionBytes are applied to current."""
        max_age = None if self.retention_ms is None else self.retention_ms / 1000.0
        return current.updated(max_age, self.retention_bytes)

    def check_writable(self) -> None:
        if not self.stream:
            raise InvalidOptionError("nothing to write to: give a stream name (save(\"events\"))")
        for name, value in (("ledgers", self.ledgers), ("view", self.view)):
            if value:
                raise InvalidOptionError(f"the {name} option is for reading; remove it from the write")
        if self.starting_offset is not None or self.ending_offset is not None:
            raise InvalidOptionError("startingOffsets/endingOffsets are for reading; remove them from the write")
        if self.has_times:
            raise InvalidOptionError("startingTimestamp/endingTimestamp are for reading; remove them from the write "
                                     "(every entry a write appends carries its append time anyway)")


def _metadata(uri: str) -> str:
    try:
        return MetadataUri.parse(uri).uri()  # with its credentials; str() would redact them
    except LedgerError as exc:
        raise InvalidOptionError(f"option metadata: {exc}") from exc


def _file(given: Mapping[str, str], key: str) -> str | None:
    path = given.get(key)
    if not path:
        return None
    if not os.path.isfile(path):
        raise InvalidOptionError(f"option {SPELLING[key]}={path!r}: no such file (the driver and every executor "
                                 "must see it at this path)")
    return path


def _stream(path: str | None) -> str | None:
    if not path:
        return None
    try:
        return check_stream_name(path)
    except LedgerError as exc:
        raise InvalidOptionError(f"option path (the stream name): {exc}") from exc


def _ledger_ids(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        ids = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise InvalidOptionError(
            f"option ledgers={text!r}: expected comma-separated ledger ids, for example \"12,13\""
        ) from exc
    if any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise InvalidOptionError(f"option ledgers={text!r}: ledger ids must be distinct non-negative integers")
    return ids


def _boolean(given: Mapping[str, str], key: str) -> bool | None:
    text = given.get(key)
    if text is None:
        return None
    value = str(text).strip().lower()
    if value not in ("true", "false"):
        raise InvalidOptionError(f"option {SPELLING[key]}={text!r}: allowed values are true, false")
    return value == "true"


def integer_option(given: Mapping[str, str], key: str, minimum: int, maximum: int | None = None,
                   spelling: Mapping[str, str] = SPELLING) -> int | None:
    """Option key (lower-case) as an integer in [minimum, maximum], or None when it is not given; errors name it
    as spelling spells it (stream_options.py passes its own)."""
    bound = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
    return _integer_where(given, key, lambda v: minimum <= v and (maximum is None or v <= maximum),
                          f"integers {bound}", spelling)


def _integer_where(given: Mapping[str, str], key: str, allowed: Callable[[int], bool], says: str,
                   spelling: Mapping[str, str] = SPELLING) -> int | None:
    """Option key as an integer for which allowed(value) holds, or None when it is not given; otherwise an error
    naming the option and saying the allowed values (says)."""
    text = given.get(key)
    if text is None:
        return None
    try:
        value = int(str(text).strip())
    except ValueError:
        value = None
    if value is None or not allowed(value):
        raise InvalidOptionError(f"option {spelling[key]}={text!r}: allowed values are {says}")
    return value


def _limit(given: Mapping[str, str], key: str, unit: str) -> int | None:
    """A retention limit: a positive integer, or -1 for none (as Kafka's retention.ms / retention.bytes)."""
    example = "604800000 (7 days)" if unit == "milliseconds" else "107374182400 (100 GiB)"
    return _integer_where(given, key, lambda v: v >= 1 or v == -1,
                          f"integers >= 1 ({unit}), or -1 to remove the stream's limit; for example "
                          f"{SPELLING[key]}={example}")


def _choice(given: Mapping[str, str], key: str, allowed: tuple[str, ...]) -> str | None:
    text = given.get(key)
    if text is None:
        return None
    value = str(text).strip().lower()
    if value not in allowed:
        raise InvalidOptionError(f"option {SPELLING[key]}={text!r}: allowed values are {', '.join(allowed)}")
    return None if value == "none" else value


def check_one_start(given: Mapping[str, str]) -> None:
    """startingOffsets and startingTimestamp both say where a read starts: refuse both rather than pick one
    (Kafka's source lets startingTimestamp win silently). given: the options as given, lower-cased."""
    if given.get("startingtimestamp") is not None and given.get("startingoffsets") is not None:
        raise InvalidOptionError(
            f"both startingOffsets={given['startingoffsets']!r} and startingTimestamp={given['startingtimestamp']!r} "
            "are given; they say the same thing (where the read starts): give one of them"
        )


def _timestamp(given: Mapping[str, str], key: str) -> int | None:
    """Milliseconds since the epoch, as Kafka's startingTimestamp/endingTimestamp take them; 0 is the epoch, and a
    time under SECONDS_BELOW is refused as seconds given for milliseconds."""
    name = SPELLING[key]
    value = _integer_where(given, key, lambda v: 0 <= v <= MAX_TIMESTAMP_MS,
                           "times in milliseconds since the epoch (an integer >= 0, up to "
                           f"{MAX_TIMESTAMP_MS}: 9999-12-31 23:59:59.999 UTC), for example {name}=1700000000000 "
                           "(2023-11-14 22:13:20 UTC)")
    if value is not None and 0 < value < SECONDS_BELOW:
        raise InvalidOptionError(
            f"option {name}={given[key]!r} looks like seconds (as milliseconds it is before 1973-03-03, before any "
            f"append); {name} takes milliseconds since the epoch: {name}={value * 1000}")
    return value


def offset_option(given: Mapping[str, str], key: str, keywords: tuple[str, ...]) -> int | None:
    """Option key as a stream offset, or None when it is one of keywords or not given; the error lists both."""
    text = given.get(key)
    if text is not None and str(text).strip().lower() in keywords:
        return None
    return _integer_where(given, key, lambda v: v >= 0, f"{', '.join(keywords)} or a non-negative stream offset")
