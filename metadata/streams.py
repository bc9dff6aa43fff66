"""Stream records: the ordered ledgers of a segmented log, its format and its commit records."""
from __future__ import annotations

import re
import time
from typing import Callable

from kazoo.exceptions import NodeExistsError, NoNodeError

from metadata import layout, serde
from metadata.errors import LedgerError, MetadataConflictError, NoSuchStreamError, StreamExistsError
from metadata.model import StreamRecord, Versioned
from metadata.store import MetadataStore

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$")


class InvalidStreamNameError(LedgerError):
    """Stream names are 1-200 letters, digits, '_', '.', '-', starting with a letter or digit."""


class InvalidStreamFormatError(LedgerError):
    """The stream holds another format than the operation needs (raw payloads vs. Arrow batches)."""


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
) -> Versioned[StreamRecord]:
    """The stream counterpart of update_loop.update_ledger."""
    for _ in range(max_attempts):
        current = read_stream(store, name)
        updated = transform(current.value)
        if updated is None or updated == current.value:
            return current
        try:
            return write_stream(store, updated, current.version)
        except MetadataConflictError:
            continue
    raise MetadataConflictError(f"stream {name!r} kept changing under {max_attempts} update attempts")


def list_streams(store: MetadataStore) -> list[str]:
    return sorted(store._call(store.zk.get_children, layout.STREAMS))


def delete_stream(store: MetadataStore, name: str) -> None:
    try:
        store._call(store.zk.delete, layout.stream_path(check_stream_name(name)))
    except NoNodeError:
        pass
