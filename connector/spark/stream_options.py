"""Options only streaming queries take, parsed on top of the batch options (options.py).

Spark hands a streaming sink its checkpointLocation as an option, and a streaming source accepts
`latest` for startingOffsets; both would be unknown to a batch read or write.

The sink's query id is the one Spark keeps in <checkpointLocation>/metadata: with the batch id it tells
a replayed batch from a new one (DESIGN section 5: after a restart Spark may commit a batch id again),
so it must survive restarts and be new for a new checkpoint. The sink's driver side
(streamWriter() when the query plans, and again for every commit) runs in a Python worker that Spark
starts for it (pyspark.sql.worker.write_into_data_source, python_streaming_sink_runner): it has no
SparkSession and no JVM, so no Hadoop FileSystem to read the checkpoint with. It reads the file itself
where Hadoop's local file system would (a path, a file: URI), and refuses any other location: an id
made up from the location would outlive a wiped checkpoint, and the restarted query's batches would
be discarded as replays of the old query's.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Mapping

from connector.spark.errors import InvalidOptionError
from connector.spark.options import LedgerOptions, _integer

LATEST = "latest"
EARLIEST = "earliest"
SPELLING = {
    name.lower(): name
    for name in ("checkpointLocation", "maxRecordsPerTrigger", "maxBytesPerTrigger", "startingOffsets")
}


@dataclasses.dataclass(frozen=True)
class StreamOptions:
    starting: str | int = EARLIEST            # earliest, latest or a stream offset
    max_records_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    checkpoint_location: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> tuple[LedgerOptions, "StreamOptions"]:
        given = {str(k).lower(): v for k, v in options.items() if v is not None}
        ours = {k: given.pop(k) for k in list(given) if k in SPELLING and k != "startingoffsets"}
        starting = str(given.get("startingoffsets", EARLIEST)).strip().lower()
        if starting == LATEST:
            given.pop("startingoffsets")
        batch = LedgerOptions.parse(given)
        return batch, cls(
            starting=LATEST if starting == LATEST else (batch.starting_offset if batch.starting_offset is not None else EARLIEST),
            max_records_per_trigger=_integer(ours, "maxrecordspertrigger", None, minimum=1, spelling=SPELLING),
            max_bytes_per_trigger=_integer(ours, "maxbytespertrigger", None, minimum=1, spelling=SPELLING),
            checkpoint_location=ours.get("checkpointlocation"),
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
