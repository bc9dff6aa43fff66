"""Options only streaming queries take, parsed on top of the batch options (options.py).

Spark hands a streaming sink its checkpointLocation as an option, and a streaming source accepts
`latest` for startingOffsets; both would be unknown to a batch read or write.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Mapping

from connector.spark.errors import InvalidOptionError
from connector.spark.options import LedgerOptions, _boolean, _integer

LATEST = "latest"
EARLIEST = "earliest"
SPELLING = {
    name.lower(): name
    for name in ("checkpointLocation", "maxRecordsPerTrigger", "maxBytesPerTrigger", "failOnDataLoss", "startingOffsets")
}


@dataclasses.dataclass(frozen=True)
class StreamOptions:
    starting: str | int = EARLIEST            # earliest, latest or a stream offset
    max_records_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    fail_on_data_loss: bool = True
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
            fail_on_data_loss=_boolean(ours, "failondataloss", True, spelling=SPELLING),
            checkpoint_location=ours.get("checkpointlocation"),
        )

    def query_id(self) -> str:
        """The streaming query's id, stable across restarts from the same checkpoint.

        Spark records it in <checkpointLocation>/metadata before the first batch; a checkpoint on a
        file system this process cannot open is identified by its location instead.
        """
        if not self.checkpoint_location:
            raise InvalidOptionError(
                "a streaming write needs option checkpointLocation: exactly-once commits are keyed by the query "
                "that the checkpoint identifies"
            )
        path = self.checkpoint_location.removeprefix("file:")
        try:
            with open(os.path.join(path, "metadata")) as f:
                return "query-" + json.load(f)["id"]
        except (OSError, ValueError, KeyError):
            return "checkpoint-" + hashlib.sha256(self.checkpoint_location.encode()).hexdigest()[:32]

