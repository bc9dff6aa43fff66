"""Errors of the Spark connector; they join the project's one hierarchy under LedgerError."""
from __future__ import annotations

from metadata.errors import LedgerError


class InvalidOptionError(LedgerError):
    """A data source option is unknown or has a value outside its allowed values."""


class SchemaMismatchError(LedgerError):
    """A DataFrame does not fit the schema the stream recorded, or an entry does not fit the stream."""


class RowTooLargeError(LedgerError):
    """One row is larger than a whole entry may be (the storage nodes' --max-entry-bytes)."""


class StreamOwnedError(LedgerError):
    """The stream's last ledger is OPEN and its writer is alive: a batch write cannot take its place."""


class UnsupportedStreamFormatError(LedgerError):
    """The operation needs a stream of another format (for example an Arrow write to a raw stream)."""


class WriteJobCommittedError(LedgerError):
    """Spark aborted a batch write job whose commit had landed: its rows are in the stream, though Spark reports the
    write failed. Running the write again would put them there twice."""


class DataLossError(LedgerError):
    """A streaming query's next offsets belong to ledgers that were deleted (see failOnDataLoss)."""


class WorkerArchiveError(LedgerError):
    """An archive of PySpark's or Py4J's could not be read or given bytecode (`ledger spark compile`)."""
