"""Stream records: the ordered ledgers of a segmented log, its format and its commit records."""
from __future__ import annotations

import re
import time
from typing import Callable

from kazoo.exceptions import ConnectionLoss, NodeExistsError, NoNodeError, OperationTimeoutError, SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError

from metadata import layout, serde
from metadata.errors import LedgerError, MetadataConflictError, MetadataError, NoSuchStreamError, StreamExistsError
from metadata.model import StreamRecord, Versioned
from metadata.store import MetadataStore

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$")
READ_BACK_SECONDS = 60.0  # how long an update whose reply was lost waits for ZooKeeper to learn its outcome
_NO_REPLY = (ConnectionLoss, SessionExpiredError, OperationTimeoutError, KazooTimeoutError)


class InvalidStreamNameError(LedgerError):
    """Stream names are 1-200 letters, digits, '_', '.', '-', starting with a letter or digit."""


class InvalidStreamFormatError(LedgerError):
    """The stream holds another format than the operation needs (raw payloads vs. Arrow batches)."""


class UpdateOutcomeUnknownError(MetadataError):
    """A stream update got no reply and ZooKeeper stayed out of reach, so whether it landed is not known."""


def check_stream_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidStreamNameError(
            f"invalid stream name {name!r}: use 1-200 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return name


def create_stream(store: MetadataStore, record: StreamRecord) -> Versioned[StreamRecord]:
    check_stream_name(record.name)
    record = record.replace(created_at=record.created_at or time.time())
    try:
        store._call(store.zk.create, layout.stream_path(record.name), serde.encode_stream(record))
    except NodeExistsError as exc:
        raise StreamExistsError(f"stream {record.name!r} exists already") from exc
    return Versioned(record, 0)


def read_stream(store: MetadataStore, name: str) -> Versioned[StreamRecord]:
    found = store.read(layout.stream_path(check_stream_name(name)), serde.decode_stream)
    if found is None:
        raise NoSuchStreamError(f"stream {name!r} does not exist; write to it first or check the name")
    return found


def find_stream(store: MetadataStore, name: str) -> Versioned[StreamRecord] | None:
    return store.read(layout.stream_path(check_stream_name(name)), serde.decode_stream)


def write_stream(store: MetadataStore, record: StreamRecord, expected_version: int) -> Versioned[StreamRecord]:
    try:
        version = store.compare_and_set(
            layout.stream_path(record.name), serde.encode_stream(record), expected_version,
            f"stream {record.name!r}",
        )
    except NoNodeError as exc:
        raise NoSuchStreamError(f"stream {record.name!r} was deleted while being updated") from exc
    return Versioned(record, version)


def update_stream(
    store: MetadataStore,
    name: str,
    transform: Callable[[StreamRecord], StreamRecord | None],
    max_attempts: int = 100,
    *,
    read_back: bool = False,
) -> Versioned[StreamRecord]:
    """The stream's one compare-and-set loop, the counterpart of update_loop.update_ledger.

    read_back=True is for a transform that recognizes its own update in a record (a commit finds its job or
    batch id there) and returns None for it. A write whose reply was lost (connection lost, session expired,
    request timed out) has an unknown outcome, not a failed one (DESIGN rule 16): the loop waits for
    ZooKeeper (at most READ_BACK_SECONDS), syncs, re-reads and transforms again, so it returns only once the
    update is known to be in the stream, and raises UpdateOutcomeUnknownError if ZooKeeper stays away. A
    request of the lost connection cannot land after that read: ZooKeeper drops the old connection's requests
    once the session reconnects, and all of them once it expires. Without read_back a lost reply raises.
    """
    deadline = None
    for _ in range(max_attempts):
        try:
            current = read_stream(store, name)
            updated = transform(current.value)
            if updated is None or updated == current.value:
                return current
            return write_stream(store, updated, current.version)
        except MetadataConflictError:
            continue
        except MetadataError as exc:
            if not (read_back and isinstance(exc.__cause__, _NO_REPLY)):
                raise
            deadline = deadline or time.monotonic() + READ_BACK_SECONDS
            _sync_when_reachable(store, name, deadline, exc)
    raise MetadataConflictError(f"stream {name!r} kept changing under {max_attempts} update attempts")


def _sync_when_reachable(store: MetadataStore, name: str, deadline: float, lost: MetadataError) -> None:
    """Wait until the session is connected again, then sync, so that the next read sees every landed write."""
    while time.monotonic() < deadline:
        if store.zk.connected:  # a request queued while disconnected would wait for ZooKeeper without bound
            try:
                store.sync(layout.stream_path(name))
                return
            except MetadataError as exc:
                if not isinstance(exc.__cause__, _NO_REPLY):
                    raise
        time.sleep(0.05)
    raise UpdateOutcomeUnknownError(
        f"stream {name!r}: an update got no reply from ZooKeeper ({lost}) and ZooKeeper stayed out of reach for "
        f"{READ_BACK_SECONDS:.0f}s, so whether it landed is unknown; read the stream once ZooKeeper is back"
    ) from lost


def list_streams(store: MetadataStore) -> list[str]:
    return sorted(store._call(store.zk.get_children, layout.STREAMS))


def delete_stream(store: MetadataStore, name: str) -> None:
    try:
        store._call(store.zk.delete, layout.stream_path(check_stream_name(name)))
    except NoNodeError:
        pass
