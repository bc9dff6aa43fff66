"""The root of the project's one error hierarchy, and the metadata errors.

Every exception raised on purpose by this project derives from LedgerError. The client adds its
protocol errors in connector/client/errors.py; the storage node its start-up refusals.
"""
from __future__ import annotations


class LedgerError(Exception):
    """Base of every error this project raises on purpose."""


class MetadataError(LedgerError):
    """ZooKeeper could not be reached or holds something unexpected."""


class ZooKeeperUnreachableError(MetadataError):
    """ZooKeeper stayed out of reach for longer than a metadata call waits for it (MetadataStore.wait_seconds)."""


class UninitialisedRootError(MetadataError):
    """The metadata root does not exist, or was never initialised as a ledger store (`ledger init` does it)."""


class MetadataConflictError(MetadataError):
    """A compare-and-set lost: someone else changed the record since it was read."""


class PlacementChangedError(MetadataError):
    """A write that places a ledger's copies on nodes chosen from a node list read before a node was marked
    decommissioned: nothing was written; read the nodes again and choose again (metadata/registry.py Placement)."""


class MetadataFormatError(MetadataError):
    """A record in ZooKeeper cannot be decoded (unknown format version or damaged JSON)."""


class NoSuchLedgerError(LedgerError):
    """The ledger does not exist in the metadata store."""


class NoSuchStreamError(LedgerError):
    """The stream does not exist in the metadata store."""


class StreamExistsError(LedgerError):
    """A stream of that name exists already."""


class StreamBeingDeletedError(LedgerError):
    """A stream of that name is being deleted (`ledger stream delete` marked it, and has not removed it yet)."""


class OffsetsGoneError(LedgerError):
    """Offsets asked for left the stream (overwritten or truncated), possibly while it was being read."""


class InvalidMetadataUriError(LedgerError):
    """The metadata URI is not of the form zk://host:port[,host:port...]/root."""


class EmbeddedZooKeeperError(LedgerError):
    """The embedded ZooKeeper could not be started."""


class ZooKeeperPortTakenError(EmbeddedZooKeeperError):
    """The embedded ZooKeeper's client port is bound by another process."""
