"""Storage node errors: start-up refusals and storage faults, all under the project's LedgerError."""
from __future__ import annotations

from metadata.errors import LedgerError


class StorageNodeError(LedgerError):
    """Base of every error the storage node raises on purpose."""


class ConfigError(StorageNodeError):
    """A command-line option has a value the node cannot run with."""


class CookieMismatchError(StorageNodeError):
    """The data directory and ZooKeeper disagree about who this node is (rule 8): refuse to start."""


class JournalCorruptError(StorageNodeError):
    """A journal segment holds a damaged record that is not a torn tail: refuse to start."""


class JournalWriteError(StorageNodeError):
    """Writing or syncing the journal failed; the records of that group are not durable."""


class StoredEntryError(StorageNodeError):
    """The index says an entry is stored but it cannot be read back intact (answer ERROR, rule 8)."""


class UncopyableRecordError(StoredEntryError):
    """Compaction could not read a record of file_number back intact (damaged, or an I/O error): that file is
    kept as it is (reads of the entry answer ERROR) and never copied again."""

    def __init__(self, message: str, file_number: int):
        super().__init__(message)
        self.file_number = file_number
