"""Options only streaming queries take, parsed on top of the batch options (options.py).

Spark hands a streaming sink its checkpointLocation (and a named query's queryName, accepted and not
used) as options, and a streaming source accepts `latest` for startingOffsets; they would be unknown to a
batch read or write.

The sink's query id is the one Spark keeps in <checkpointLocation>/metadata: with the batch id it tells
a replayed batch from a new one (DESIGN section 5: after a restart Spark may commit a batch id again),
so it must survive restarts and be new for a new checkpoint. The sink's driver side
(streamWriter() when the query plans, and again for every commit) runs in a Python worker that Spark
starts for it (pyspark.sql.worker.write_into_data_source, python_streaming_sink_runner): it has no
SparkSession and no JVM, so no Hadoop FileSystem to read the checkpoint with. It reads the file itself
where Hadoop's local file system would (a path, a file: URI), and refuses any other location: an id
made up from the location would outlive a wiped checkpoint, and the restarted query's batches would
be discarded as replays of the old query's.

Admission (minOffsetsPerTrigger, maxTriggerDelay) is Kafka's: a micro-batch is not planned until at least
minOffsetsPerTrigger new offsets are there, unless maxTriggerDelay has passed since the last one was
planned. maxOffsetsPerTrigger is Kafka's name for maxRecordsPerTrigger; a query ported from Kafka keeps
its options, and two different values for the one limit are refused rather than one picked.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Mapping

from connector.checkpoint import local_path  # noqa: F401 - also imported from here
from connector.spark.errors import InvalidOptionError
from connector.spark.options import LedgerOptions, check_one_start, integer_option, offset_option

LATEST = "latest"
EARLIEST = "earliest"
SPELLING = {
    name.lower(): name
    for name in ("checkpointLocation", "maxRecordsPerTrigger", "maxOffsetsPerTrigger", "maxBytesPerTrigger",
                 "minOffsetsPerTrigger", "maxTriggerDelay", "startingOffsets", "queryName")
}
DEFAULT_MAX_TRIGGER_DELAY = 15 * 60.0  # seconds; Kafka's default "15m"
# Kafka's source reads maxTriggerDelay with Spark's timeStringAsMs: an integer and a unit, milliseconds without one.
_DELAY = re.compile(r"(\d+)(us|ms|s|m|min|h|d)?")
_DELAY_UNITS = {"us": 1e-6, "ms": 1e-3, None: 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


@dataclasses.dataclass(frozen=True)
class StreamOptions:
    starting: str | int = EARLIEST            # earliest, latest or a stream offset
    max_records_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    checkpoint_location: str | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay: float = DEFAULT_MAX_TRIGGER_DELAY  # seconds

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> tuple[LedgerOptions, "StreamOptions"]:
        given = {str(k).lower(): v for k, v in options.items() if v is not None}
        ours = {k: given.pop(k) for k in list(given) if k in SPELLING and k != "startingoffsets"}
        starting = str(given.get("startingoffsets", EARLIEST)).strip().lower()
        check_one_start(given)   # before startingOffsets=latest is taken off: with startingTimestamp, one is too many
        offset = offset_option(given, "startingoffsets", (EARLIEST, LATEST))   # its error names latest too
        if starting == LATEST:
            given.pop("startingoffsets")
        batch = LedgerOptions.parse(given, streaming=SPELLING)
        return batch, cls(
            starting=LATEST if starting == LATEST else (EARLIEST if offset is None else offset),
            max_records_per_trigger=_max_records(ours),
            max_bytes_per_trigger=integer_option(ours, "maxbytespertrigger", minimum=1, spelling=SPELLING),
            checkpoint_location=ours.get("checkpointlocation"),
            min_offsets_per_trigger=integer_option(ours, "minoffsetspertrigger", minimum=1, spelling=SPELLING),
            max_trigger_delay=_max_trigger_delay(ours),
        )

    def query_id(self) -> str:
        """The streaming query's id, stable across restarts from the same checkpoint and new for a new one."""
        location = self.checkpoint_location
        if not location:
            raise InvalidOptionError(
                "a streaming write needs option checkpointLocation: exactly-once commits are keyed by the query "
                "that the checkpoint identifies"
            )
        path = local_path(location)
        if path is None:
            raise InvalidOptionError(
                f"option checkpointLocation {location!r}: the exactly-once sink keys its commits by the query id "
                f"Spark keeps in {location.rstrip('/')}/metadata, and the Python worker that runs the sink's commits "
                "has no SparkSession or Hadoop client to read that file system with; give checkpointLocation as a "
                "local path or a file: URI (a shared file system mounted on the driver's host works)"
            )
        metadata = os.path.join(path, "metadata")
        try:
            with open(metadata) as f:
                return "query-" + json.load(f)["id"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InvalidOptionError(
                f"option checkpointLocation {location!r}: cannot read the query id Spark keeps in {metadata} "
                f"({exc}); the exactly-once sink keys its commits by it. Spark writes that file when the query "
                "starts: check that the driver's host sees the checkpoint at this path"
            ) from exc


def _max_records(given: Mapping[str, str]) -> int | None:
    """maxRecordsPerTrigger, or maxOffsetsPerTrigger (Kafka's name for it); both only if they agree."""
    ours = integer_option(given, "maxrecordspertrigger", minimum=1, spelling=SPELLING)
    kafkas = integer_option(given, "maxoffsetspertrigger", minimum=1, spelling=SPELLING)
    if ours is not None and kafkas is not None and ours != kafkas:
        raise InvalidOptionError(
            f"options maxRecordsPerTrigger={ours} and maxOffsetsPerTrigger={kafkas} disagree: maxOffsetsPerTrigger is "
            "Kafka's name for maxRecordsPerTrigger, the one limit on the offsets of a micro-batch; give one of them"
        )
    return ours if ours is not None else kafkas


def _max_trigger_delay(given: Mapping[str, str]) -> float:
    """Seconds, from Kafka's format ("30s", "5m", "1h", "500ms"; a bare integer is milliseconds)."""
    text = given.get("maxtriggerdelay")
    if text is None:
        return DEFAULT_MAX_TRIGGER_DELAY
    if given.get("minoffsetspertrigger") is None:
        raise InvalidOptionError(
            f"option maxTriggerDelay={text!r} bounds how long minOffsetsPerTrigger holds a micro-batch back, and "
            "minOffsetsPerTrigger is not set: set it too (as in Kafka's source), or remove maxTriggerDelay"
        )
    match = _DELAY.fullmatch(str(text).strip().lower())
    if match is None:
        raise InvalidOptionError(
            f"option maxTriggerDelay={text!r}: give a duration as Kafka's source takes it, an integer with a unit "
            "us, ms, s, m (or min), h or d: \"30s\", \"5m\", \"500ms\" (without a unit: milliseconds); the "
            "default is \"15m\""
        )
    return int(match.group(1)) * _DELAY_UNITS[match.group(2)]
