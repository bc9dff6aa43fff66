"""A streaming query's checkpoint, read without Spark: where the query stands in each of its sources.

Spark writes offsets/N when it plans micro-batch N (after a
version line and a metadata line, one line per source: the end offset that source announced, `-` for none;
in the v2 format each line is `SOURCE:OFFSET`) and commits/N once the batch is done. The newest N in
commits/ is the last committed batch, and its offsets/N line of a ledger source is {"offset": n, "stream":
name}: the next offset the query reads from that stream (offsets of checkpoints written before the source
named its stream in them carry only "offset"). Spark keeps the newest 100 batches (minBatchesToRetain), so
listing the two directories and reading two files costs the same however long the query has run.

Only checkpoints on the local file system (a path, a file: URI) are read, as the sink reads the query id
(connector/spark/stream_options.py): no Hadoop client here.
"""
from __future__ import annotations

import dataclasses
import json
import os

from metadata.errors import LedgerError


class CheckpointError(LedgerError):
    """A streaming query's checkpoint cannot be found or read."""


@dataclasses.dataclass(frozen=True)
class SourceOffset:
    """One source's line in a checkpoint's offsets file: its position in the query, and, for a ledger stream, the
    stream (None if the offset does not name it) and the offset (the next one the query reads)."""

    source: str
    stream: str | None
    offset: int | None
    created: float | None = None   # the stream's creation time the offset is of (None before offsets carried it)


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """The last committed batch of a query and its sources' offsets; the batch planned after it, if any."""

    path: str
    committed_batch: int | None
    committed: tuple[SourceOffset, ...]
    planned_batch: int | None = None
    planned: tuple[SourceOffset, ...] = ()


def read_checkpoint(location: str) -> Checkpoint:
    """The last committed batch of the query whose checkpointLocation is location (a path or a file: URI)."""
    path = local_path(location)
    if path is None:
        raise CheckpointError(
            f"checkpoint {location!r} is not on the local file system; give a local path or a file: URI (copy "
            "its offsets/ and commits/ directories here, or run the command where the file system is mounted)"
        )
    if not os.path.isdir(os.path.join(path, "offsets")):
        raise CheckpointError(
            f"no streaming query checkpoint at {location!r}: it has no offsets/ directory (give the "
            "checkpointLocation of the query; Spark creates offsets/ when the query plans its first batch)"
        )
    committed = _batches(os.path.join(path, "commits"))
    planned = _batches(os.path.join(path, "offsets"))
    last = max(committed) if committed else None
    ahead = max((batch for batch in planned if last is None or batch > last), default=None)
    return Checkpoint(
        path, last, _sources(path, last) if last is not None else (),
        ahead, _sources(path, ahead) if ahead is not None else (),
    )


def _batches(directory: str) -> list[int]:
    """The batch ids of a checkpoint log directory (its files named by number; .crc and temporary files aside)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CheckpointError(f"cannot list {directory}: {exc}") from exc
    return [int(name) for name in names if name.isdigit()]


def _sources(path: str, batch: int) -> tuple[SourceOffset, ...]:
    file = os.path.join(path, "offsets", str(batch))
    try:
        with open(file, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError as exc:
        raise _not_offsets(file, f"byte {exc.start}: not UTF-8 text") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {file}: {exc}") from exc
    if not lines:
        raise _not_offsets(file, "it is empty")
    if lines[0] not in ("v1", "v2") or len(lines) < 2:
        raise _not_offsets(file, f"line 1: {lines[0][:40]!r}; Spark writes `v1` or `v2`, then its metadata, then "
                                 "one line per source")
    found = []
    for number, line in enumerate(lines[2:], start=3):
        if lines[0] == "v1":
            source, text = str(number - 3), line
        elif ":" in line:
            source, text = line.split(":", 1)
        else:
            raise _not_offsets(file, f"line {number}: {line[:40]!r} is not SOURCE:OFFSET, as v2 writes a source")
        found.append(_source_offset(file, number, source, text))
    return tuple(found)


def _not_offsets(file: str, why: str) -> CheckpointError:
    return CheckpointError(f"{file} is not a Spark offsets file this command reads ({why}); check that --checkpoint "
                           "is the query's checkpointLocation")


def _source_offset(file: str, number: int, source: str, text: str) -> SourceOffset:
    """A ledger source's offset, or one with neither stream nor offset for another source (or none, `-`)."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, dict) and isinstance(value.get("offset"), int):
        if isinstance(value["offset"], bool) or value["offset"] < 0:   # a lag from it would mean nothing
            raise _not_offsets(file, f"line {number}: offset {value['offset']!r} is not a stream offset (an integer "
                                     ">= 0)")
        stream, created = value.get("stream"), value.get("created")
        return SourceOffset(source, stream if isinstance(stream, str) else None, value["offset"],
                            created if isinstance(created, (int, float)) else None)
    return SourceOffset(source, None, None)


def local_path(location: str) -> str | None:
    """The local path a checkpointLocation names, as Hadoop resolves it, or None if it is on another file system.

    A location without a scheme is on the default file system (the local one unless fs.defaultFS says
    otherwise). Hadoop's local file system takes file:/p, file:///p and no other authority, and reads
    the rest literally (no percent-decoding), as open() does.
    """
    colon, slash = location.find(":"), location.find("/")
    if colon < 0 or 0 <= slash < colon:
        return location
    scheme, rest = location[:colon], location[colon + 1:]
    if scheme.lower() != "file" or (rest.startswith("//") and not rest.startswith("///")):
        return None
    return rest
