"""The public, synchronous ledger client: LedgerClient, WriteHandle, ReadHandle.

Handles hold an immutable Versioned[LedgerMetadata] and pass it to the ops; every metadata change goes
through update_ledger's compare-and-set loop. The I/O runs on the process's client event loop
(runner.Runtime.shared()), over a transport the client makes at its first call to a storage node: the modules
of that side (runner, transport, gRPC, asyncio; crc32c at the first digest) are imported there, so a client that
only reads and writes metadata does not load them.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import itertools
import os
import threading
import time
import uuid
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping

from connector.client import entry_time
from connector.client.errors import (
    ClientClosedError,
    LedgerClosedError,
    LedgerError,
    NodeError,
    UnauthorizedError,
    check_entry_sizes,
    closed_message,
    unauthorized_message,
)
from connector.client.limits import DEFAULT_MAX_ENTRY_BYTES, MAX_SENDABLE_ENTRY_BYTES
from connector.client.ops.close import close_own
from connector.client.ops.read import DEFAULT_SPECULATIVE_READ_TIMEOUT, ChunkPlan, Entry, ReadWindow
from connector.client.placement import choose_ensemble
from connector.client.retry import Retry
from connector.client.security import TlsConfig, token_from_env
from connector.client.schedule import Schedule
from metadata import layout, registry
from metadata.errors import PlacementChangedError
from metadata.model import Fragment, LedgerMetadata, NodeRegistration, Versioned, make_custom_metadata
from metadata.store import DEFAULT_URI, METADATA_ENV, MetadataStore
from metadata.update_loop import update_ledger
from protos.digest import master_key, password_hash

if TYPE_CHECKING:
    import asyncio

    from connector.client.runner import AddPipeline, Context, Runtime
    from connector.client.transport import GrpcTransport

PLACEMENT_ATTEMPTS = 10   # creations refused because a node was decommissioned meanwhile, before giving up


def default_metadata_uri() -> str:
    return os.environ.get(METADATA_ENV) or DEFAULT_URI


class LedgerClient:
    """A connection to the ledger store. Use as a context manager, or call close().

    timeout bounds the wait for one node's answer to a read or fence; add_timeout is how long a node may leave
    an add unacknowledged before the writer replaces it (rule 3).

    tls (mutual TLS to the storage nodes) and auth_token (nodes started with --auth-token-file) default to
    $LEDGER_TLS_CA/_CERT/_KEY and $LEDGER_AUTH_TOKEN_FILE (see security.py). ZooKeeper credentials travel in
    the URI (zk://user:secret@host:port/root) or $LEDGER_ZK_AUTH. node_addresses (node id -> host:port) makes
    the client dial those addresses instead of the registered ones, e.g. a proxy in front of each node.

    max_entry_bytes: the largest entry a write handle sends, the storage nodes' --max-entry-bytes (8 MiB by
    default on both sides; at most what one gRPC message carries, just under 64 MiB): a larger one is refused
    with EntryTooLargeError before anything is sent.

    speculative_read_timeout: seconds a read waits for a node's first (or next) answer before it asks another
    replica as well, taking the first valid answer (BookKeeper's speculativeReadTimeout); 0 turns it off, and a
    read then waits up to timeout for each node in turn.
    """

    def __init__(self, uri: str | None = None, *, timeout: float = 5.0, add_timeout: float = 10.0,
                 tls: TlsConfig | None = None, auth_token: str | None = None,
                 node_addresses: Mapping[str, str] | None = None, connect_timeout: float = 15.0,
                 max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES,
                 speculative_read_timeout: float = DEFAULT_SPECULATIVE_READ_TIMEOUT):
        if not 1 <= max_entry_bytes <= MAX_SENDABLE_ENTRY_BYTES:
            raise ValueError(f"max_entry_bytes must be 1..{MAX_SENDABLE_ENTRY_BYTES:,} (the most one gRPC message to a "
                             f"node carries), not {max_entry_bytes:,}")
        if not speculative_read_timeout >= 0:
            raise ValueError(f"speculative_read_timeout must be 0 (off) or more seconds, "
                             f"not {speculative_read_timeout}")
        self.speculative_read_timeout = speculative_read_timeout
        self.max_entry_bytes = max_entry_bytes
        self.uri = uri or default_metadata_uri()
        self.node_addresses = dict(node_addresses or {})
        self.tls = tls if tls is not None else TlsConfig.from_env()
        self.auth_token = auth_token if auth_token is not None else token_from_env()
        self.store = MetadataStore(self.uri, connect_timeout=connect_timeout)
        try:
            if self.tls is not None:
                self.tls.pem_files()  # a missing or unreadable file fails here, not at the first node call
            self.writer_id = f"writer-{uuid.uuid4().hex}"
            self._writer_registration = registry.register_writer(self.store, self.writer_id)
        except BaseException:
            self.store.close()
            raise
        self._timeouts = (timeout, add_timeout)
        self._io: tuple[Runtime, Context] | None = None  # started by the first call to a node (_node_io)
        self._io_lock = threading.Lock()
        self._recoveries: dict[int, asyncio.Future] = {}
        self._pipelines: set[AddPipeline] = set()  # of open write handles, stopped when the client closes
        self._closed = False
        self._listed: tuple[Mapping[str, NodeRegistration], float] | None = None   # the last placement read

    def transport(self) -> GrpcTransport:
        """A new transport to the storage nodes with this client's TLS settings and token, which takes the nodes
        this client's last ledger creation read for a listing (a write task's first channels need no read)."""
        from connector.client.transport import GrpcTransport

        return GrpcTransport(self.store, self.tls, self.auth_token, self.node_addresses, listed=self._listed)

    @property
    def _runtime(self) -> Runtime:
        return self._node_io()[0]

    @property
    def _ctx(self) -> Context:
        return self._node_io()[1]

    def _node_io(self) -> tuple[Runtime, Context]:
        """The event loop and the transport this client talks to nodes with, made on its first call to a node:
        a client that only reads and writes metadata (Spark's driver-side steps, mostly) never imports gRPC,
        asyncio or crc32c, about 0.2 CPU s in each new Spark Python worker. A client closed before that call
        refuses it (nothing would close what it started)."""
        io = self._io
        if io is None:
            with self._io_lock:
                if self._io is None:
                    if self._closed:
                        raise ClientClosedError("this LedgerClient is closed; open a new one to reach the nodes")
                    from connector.client.runner import Context, Runtime

                    self._io = (Runtime.shared(), Context(self.store, self.transport(), *self._timeouts,
                                                          speculative_timeout=self.speculative_read_timeout))
                io = self._io
        return io

    def __enter__(self) -> "LedgerClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with self._io_lock:   # a first call to a node either started before this (and is shut down) or is refused
            if self._closed:
                return
            self._closed = True
            io = self._io
        try:
            if io is not None:
                io[0].run(self._shutdown())
        finally:
            # The writer's liveness znode ends with the session: closing must not wait for an unreachable
            # ZooKeeper (a delete would, up to the store's bound) and must close the session whatever happens.
            self._writer_registration.end_with_session()
            self.store.close()

    async def _shutdown(self) -> None:
        """Stop what this client started on the shared loop: its pipelines, recoveries and connections."""
        import asyncio

        for pipeline in self._pipelines:
            pipeline.stop()
        self._pipelines.clear()
        running = list(self._recoveries.values())
        for recovery in running:
            recovery.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await self._ctx.transport.close()

    # -- ledgers -----------------------------------------------------------------------------------------------

    def create_ledger(self, ensemble_size: int = 3, write_quorum: int = 3, ack_quorum: int = 2,
                      password: bytes = b"", custom_metadata: Mapping[str, object] | None = None,
                      ledger_id: int | None = None, guard: str | None = None) -> "WriteHandle":
        """A new ledger, OPEN, written by this client. With ledger_id and guard (both or neither): the ledger
        gets that id, allocated beforehand with store.allocate_ledger_id, and is created only while the znode
        guard is at version 0, else MetadataConflictError (MetadataStore.create_ledger_guarded)."""
        if (ledger_id is None) != (guard is None):
            raise ValueError("create_ledger takes ledger_id and guard together, or neither")
        Schedule(ensemble_size, write_quorum, ack_quorum)  # refuses impossible quorums before anything is stored
        for attempt in itertools.count(1):
            read_at = time.monotonic()
            placement = registry.placement(self.store)
            self._listed = (placement.registered, read_at)
            meta = LedgerMetadata(
                ledger_id=0, ensemble_size=ensemble_size, write_quorum=write_quorum, ack_quorum=ack_quorum,
                fragments=(Fragment(0, choose_ensemble(placement.nodes, ensemble_size)),),
                password_hash=password_hash(password), custom_metadata=make_custom_metadata(custom_metadata),
                writer_id=self.writer_id, created_at=time.time(),
            )
            try:
                if guard is None:
                    created = self.store.create_ledger(meta, placement.epoch)
                else:
                    created = self.store.create_ledger_guarded(meta.replace(ledger_id=ledger_id), guard,
                                                               placement.epoch)
            except PlacementChangedError:
                if attempt == PLACEMENT_ATTEMPTS:
                    raise
                continue      # a node was decommissioned meanwhile: choose again
            return WriteHandle(self, created, master_key(password))

    def open_ledger(self, ledger_id: int, password: bytes = b"", recover: bool = True,
                    confirmed: int | None = None, current: Versioned[LedgerMetadata] | None = None) -> "ReadHandle":
        """A reader. recover=True fences and closes an OPEN ledger first (rules 10-12); recover=False reads an
        OPEN ledger up to its LAC, for tailing, which it asks the nodes for, unless the caller gives an entry it
        knows was confirmed (a LAC it read before, e.g. the one a Spark driver planned with): then the handle
        reads up to that entry without asking (read_lac() asks later). current: the ledger's metadata as the
        caller just read it (store.read_ledger), so that it is not read again; the password is checked as ever."""
        current = self._authorized(ledger_id, password, current)
        if recover and not current.value.is_closed:
            current = self._recover(current, password)
        return ReadHandle(self, current, confirmed)

    def recover_ledger(self, ledger_id: int, password: bytes = b"") -> LedgerMetadata:
        """Fence and close a ledger another client was writing; its metadata once CLOSED."""
        current = self._authorized(ledger_id, password)
        return current.value if current.value.is_closed else self._recover(current, password).value

    def recover_ledger_with_retry(self, ledger_id: int, password: bytes = b"",
                                  retry: Retry | None = None) -> LedgerMetadata:
        """recover_ledger, retried with backoff while nodes are missing (RecoveryIncompleteError)."""
        return (retry or Retry())(self.recover_ledger, ledger_id, password)

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return self.store.read_ledger(ledger_id).value

    def list_ledgers(self) -> list[int]:
        return self.store.list_ledgers()

    def delete_ledger(self, ledger_id: int) -> None:
        """Remove the ledger's metadata; its entries become unreachable (nodes garbage-collect them)."""
        self.store.read_ledger(ledger_id)
        self.store.delete_ledger(ledger_id)

    def is_dangling(self, meta: LedgerMetadata) -> bool:
        """Not closed, and its writer's liveness znode is gone: nobody will close it but a recovery."""
        return not meta.is_closed and not registry.writer_alive(self.store, meta.writer_id)

    # -- internals ---------------------------------------------------------------------------------------------

    def _authorized(self, ledger_id: int, password: bytes,
                    current: Versioned[LedgerMetadata] | None = None) -> Versioned[LedgerMetadata]:
        if current is None:
            current = self.store.read_ledger(ledger_id)
        elif current.value.ledger_id != ledger_id:
            raise ValueError(f"the metadata given for ledger {ledger_id} is ledger {current.value.ledger_id}'s")
        if current.value.password_hash != password_hash(password):
            raise UnauthorizedError(unauthorized_message(ledger_id))  # before any node is touched (rule 7)
        return current

    def _recover(self, current: Versioned[LedgerMetadata], password: bytes) -> Versioned[LedgerMetadata]:
        return self._runtime.run(self._recover_once(current, master_key(password)))

    async def _recover_once(self, current: Versioned[LedgerMetadata], key: bytes) -> Versioned[LedgerMetadata]:
        """One recovery per ledger at a time in this client; concurrent callers share its outcome."""
        import asyncio

        from connector.client.runner import recover

        ledger_id = current.value.ledger_id
        running = self._recoveries.get(ledger_id)
        if running is None:
            running = asyncio.ensure_future(recover(self._ctx, current, key))
            self._recoveries[ledger_id] = running
            running.add_done_callback(lambda _: self._recoveries.pop(ledger_id, None))
        return await asyncio.shield(running)


class WriteHandle:
    """The writer of one ledger (only its creator writes it). append after AQ acks; close at the LAC."""

    def __init__(self, client: LedgerClient, current: Versioned[LedgerMetadata], key: bytes):
        self._client = client
        self._runtime = client._runtime
        self.ledger_id = current.value.ledger_id
        self._pipeline: AddPipeline = self._runtime.run(_make_pipeline(client._ctx, current, key))
        client._pipelines.add(self._pipeline)
        self._closed: LedgerMetadata | None = None

    def __enter__(self) -> "WriteHandle":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except LedgerError:
            if exc_type is None:
                raise

    @property
    def last_add_confirmed(self) -> int:
        return self._pipeline.seq.last_add_confirmed

    @property
    def metadata(self) -> LedgerMetadata:
        return self._pipeline.current.value

    def append(self, payload: bytes) -> int:
        """Add one entry; returns its id once AQ nodes of its write set acknowledged it."""
        return self.append_async(payload).result()

    def append_async(self, payload: bytes) -> concurrent.futures.Future:
        """Add one entry without waiting; futures complete in entry order with the entry id. An entry over the
        client's max_entry_bytes raises EntryTooLargeError here, and the ledger takes the next one as before."""
        self._check_open()
        if len(payload) > self._client.max_entry_bytes:
            check_entry_sizes((payload,), self._client.max_entry_bytes)
        return self._pipeline.append_async(payload)

    def append_many(self, payloads: Iterable[bytes]) -> list[int]:
        """Add several entries, in order; returns their entry ids once every one was acknowledged by AQ nodes of
        its write set. Each entry is its own add (own id, own acknowledgements); the batch shares the
        hand-over to the client's I/O thread and one future, which is what makes small entries cheap."""
        return self.append_many_async(payloads).result()

    def append_many_async(self, payloads: Iterable[bytes]) -> concurrent.futures.Future:
        """append_many without waiting: a future of the entry ids, completed in entry order with other appends.
        One entry over max_entry_bytes refuses the whole batch (EntryTooLargeError): none of it is sent."""
        self._check_open()
        payloads = payloads if isinstance(payloads, (list, tuple)) else list(payloads)
        check_entry_sizes(payloads, self._client.max_entry_bytes)
        return self._pipeline.append_many_async(payloads)

    def _check_open(self) -> None:
        if self._closed is not None:
            raise LedgerClosedError(closed_message(self.ledger_id))

    def close(self, custom_metadata: Mapping[str, object] | None = None) -> LedgerMetadata:
        """Wait for pending adds, then CAS CLOSED with last_entry_id = LAC (rule 4). Closing twice is safe.
        custom_metadata is added to the ledger's in that CAS (a ledger closed already keeps its own)."""
        if self._closed is None:
            self._runtime.run(self._stop_pipeline())
            seq = self._pipeline.seq
            stored = update_ledger(self._client.store, self.ledger_id,
                                   close_own(self.ledger_id, seq.last_add_confirmed, seq.length, custom_metadata),
                                   current=self._pipeline.current)
            self._closed = stored.value
        return self._closed

    def abandon(self) -> None:
        """Stop writing without closing the ledger, for a writer that must leave it OPEN to another's recovery (a
        stream writer whose takeover failed with the stream holding its ledger: the stream's next owner recovers
        it, rule 14). Pending and later adds fail; its pipeline stops and leaves the client."""
        if self._closed is None:
            self._runtime.run(self._stop_pipeline(drain=False))

    async def _stop_pipeline(self, drain: bool = True) -> None:
        if drain:
            await self._pipeline.drain()
        self._pipeline.stop()
        self._client._pipelines.discard(self._pipeline)


async def _make_pipeline(ctx: Context, current: Versioned[LedgerMetadata], key: bytes) -> AddPipeline:
    from connector.client.runner import AddPipeline

    return AddPipeline(ctx, current, key)


class ReadHandle:
    """Reads a closed ledger up to last_entry_id, or an OPEN one (opened with recover=False) up to its LAC."""

    def __init__(self, client: LedgerClient, current: Versioned[LedgerMetadata], confirmed: int | None = None):
        self._client = client
        self._current = current
        self.ledger_id = current.value.ledger_id
        self.last_entry_id = current.value.last_entry_id if current.value.is_closed else -1
        if not current.value.is_closed:
            # current was just read: only the nodes are asked, unless the caller knows a confirmed entry
            self.last_entry_id = self._nodes_lac() if confirmed is None else max(-1, confirmed)

    @property
    def _ctx(self) -> Context:
        return self._client._ctx

    @property
    def _runtime(self) -> Runtime:
        return self._client._runtime

    @property
    def metadata(self) -> LedgerMetadata:
        return self._current.value

    @property
    def is_closed(self) -> bool:
        return self._current.value.is_closed

    def read(self, first: int = 0, last: int | None = None, *, confirmed: int = -1,
             views: bool = False) -> Iterator[Entry]:
        """Entries first..last (default: to last_entry_id) in order, several chunks read in parallel; each is an
        entry_time.TimedEntry: the payload as written and, for a ledger whose entries carry times, the time.

        confirmed: an entry the caller knows was confirmed, e.g. the LAC a Spark driver planned with. The nodes
        this handle asked may know a lower LAC (each node's LAC lags its own way), but the entries up to a LAC
        anyone saw were acknowledged, so they are readable whatever this handle's LAC read said.

        views: payloads may be read-only memoryviews into the messages received (for readers that decode them
        at once, such as a Spark read: entries of 16 KiB or more then reach the reader without any copy, see
        protos/wire.py); without it every payload is bytes.
        """
        if not self.is_closed:
            self.last_entry_id = max(self.last_entry_id, confirmed)
        last = self.last_entry_id if last is None else last
        if first < 0 or last > self.last_entry_id or first > last + 1:
            raise ValueError(
                f"cannot read entries {first}..{last} of ledger {self.ledger_id}: readable entries are "
                f"0..{self.last_entry_id}" + ("" if self.is_closed else " (its LAC; call read_lac() for more)"))
        return self._read(first, last, views)

    def _read(self, first: int, last: int, views: bool) -> Iterator[Entry]:
        """The entries, read with this handle's metadata. If no replica it names can serve an entry, the metadata
        is read again: when its fragments changed since (a writer's ensemble change past the entries this handle
        knew of, or a re-replication), the rest is read once more with them."""
        refreshed = False
        while True:
            try:
                with contextlib.closing(self._read_with(self._current.value, first, last, views)) as reading:
                    for entry in reading:
                        yield entry
                        first = entry.entry_id + 1
                return
            except NodeError:
                if refreshed or not self._fragments_changed():
                    raise   # the nodes' error, also when the metadata could not be read again
                refreshed = True

    def _fragments_changed(self) -> bool:
        store = self._client.store
        try:
            store.sync(layout.ledger_path(self.ledger_id))   # a lagging follower could still show the old fragments
            fresh = store.read_ledger(self.ledger_id)
        except LedgerError:
            return False
        changed = fresh.value.fragments != self._current.value.fragments
        self._current = fresh
        if fresh.value.is_closed:
            self.last_entry_id = fresh.value.last_entry_id   # as read_lac: a closed ledger's end is its own
        return changed

    def _read_with(self, meta: LedgerMetadata, first: int, last: int, views: bool) -> Iterator[Entry]:
        from connector.client.runner import read_chunk

        plan, window = ChunkPlan(meta, first, last), ReadWindow(meta)
        in_flight: collections.deque = collections.deque()
        while True:
            while len(in_flight) < window.chunks_in_flight and (chunk := plan.next(window.chunk_entries)) is not None:
                in_flight.append(self._runtime.submit(read_chunk(self._ctx, chunk)))
            if not in_flight:
                return
            try:
                entries = in_flight.popleft().result()
                window.on_chunk_read(len(entries), sum(len(entry.payload) for entry in entries))
                yield from entry_time.stripped(meta, entries, views)  # without the time frame, if any
            except BaseException:
                for future in in_flight:
                    future.cancel()
                raise

    def read_lac(self) -> int:
        """Refresh: the ledger's last entry if closed by now, else the LAC read from its nodes (no fencing)."""
        self._current = self._client.store.read_ledger(self.ledger_id)
        meta = self._current.value
        if meta.is_closed:
            self.last_entry_id = meta.last_entry_id
        else:
            self.last_entry_id = max(self.last_entry_id, self._nodes_lac())
        return self.last_entry_id

    def _nodes_lac(self) -> int:
        """The LAC the nodes of the OPEN ledger know (no fencing)."""
        from connector.client.runner import read_last_add_confirmed

        op = self._runtime.run(read_last_add_confirmed(self._ctx, self._current.value, b"", fence=False))
        return op.last_add_confirmed

    def wait_lac(self, previous: int | None = None, timeout: float = 10.0) -> int:
        """Long poll for tailing: returns once the LAC passes previous (default: last_entry_id) or at timeout
        (a wait longer than a node's longest, protos.limits.MAX_WAIT_LAC_MS, asks the nodes again)."""
        if not timeout >= 0:
            raise ValueError(f"wait_lac's timeout must be 0 or more seconds, not {timeout}")
        previous = self.last_entry_id if previous is None else previous
        if self._current.value.is_closed:
            return self.last_entry_id
        from connector.client.runner import wait_last_add_confirmed

        lac = self._runtime.run(wait_last_add_confirmed(self._ctx, self._current.value, previous, timeout))
        if lac <= previous:
            return self.read_lac()
        self.last_entry_id = max(self.last_entry_id, lac)
        return self.last_entry_id
