"""The metadata store: ledger records in ZooKeeper, every update a compare-and-set on the znode version."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import re
import time
import urllib.parse
import uuid
import warnings
from typing import Callable, Iterator

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError, ConnectionLoss, KazooException, NoAuthError, NodeExistsError, NoNodeError, OperationTimeoutError,
    RolledBackError, RuntimeInconsistency, SessionExpiredError,
)
from kazoo.security import make_digest_acl
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.watchers import DataWatch
from kazoo.protocol.states import KeeperState, ZnodeStat
from kazoo.retry import KazooRetry

from metadata import layout, serde
from metadata.errors import (
    InvalidMetadataUriError,
    MetadataConflictError,
    MetadataError,
    MetadataFormatError,
    NoSuchLedgerError,
    PlacementChangedError,
    UninitialisedRootError,
    ZooKeeperUnreachableError,
)
from metadata.ledger_ids import LedgerIds
from metadata.model import LedgerMetadata, Versioned

log = logging.getLogger(__name__)

DEFAULT_URI = "zk://127.0.0.1:2181/ledgers"
ZOOKEEPER_TREE = "/zookeeper"   # ZooKeeper's own znodes (quotas, configuration): no place for a metadata root
METADATA_ENV = "LEDGER_METADATA"  # the metadata URI every command and node uses when not given one
ZK_AUTH_ENV = "LEDGER_ZK_AUTH"   # user:secret, used when the metadata URI carries no credentials
ZK_WAIT_ENV = "LEDGER_ZK_WAIT_SECONDS"  # how long a metadata call waits for an unreachable ZooKeeper
DEFAULT_ZK_WAIT_SECONDS = 60.0
# A request that got no answer: the connection dropped or the session expired before its reply came, or it
# timed out. It may or may not have taken effect (DESIGN rule 16).
NO_REPLY = (ConnectionLoss, SessionExpiredError, OperationTimeoutError, KazooTimeoutError)
_CONNECTED_POLL = 0.05  # seconds between looks at the session state while waiting for ZooKeeper
_PIPELINED = 1000       # requests exist() sends before it awaits their replies
_URI = re.compile(
    r"^zk://(?:(?P<user>[^:@/]+):(?P<secret>[^@/]+)@)?(?P<hosts>[^/@]+)(?P<root>(/[A-Za-z0-9_.\-]+)+)/?$"
)
# Up to the URI's last '@': a secret may hold '@' itself (it should be percent-encoded, but a leak is no way to say so).
_USERINFO = re.compile(r"(zk://[^:\s]*:)\S*@")   # the user may hold "@" or "/" too
_ENCODE_USERINFO = "percent-encode '@', ':' and '/' in the user or secret: '@' as %40, ':' as %3A, '/' as %2F"
# kazoo warns when a chrooted session starts on a root that does not exist; the store reports that itself, in
# one line that says what to do (UninitialisedRootError).
warnings.filterwarnings("ignore", message="No chroot path exists", category=UserWarning, module="kazoo")


def _check_host(uri: str, host: str) -> None:
    """Each host:port of a metadata URI, checked here: kazoo would fail later with a bare ValueError."""
    name, sep, port = host.rpartition(":")
    if not sep:
        name, port = host, "2181"
    if not name or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidMetadataUriError(
            f"metadata URI {redact_uri(str(uri))!r}: {host!r} is not host:port with a port in 1-65535, "
            f"for example {DEFAULT_URI}"
        )


def _check_root(uri: str, root: str) -> None:
    """The root names one znode path as it is (kazoo refuses '.' and '..' segments with a bare ValueError), outside
    ZooKeeper's own /zookeeper tree (its quotas and configuration)."""
    if any(segment in (".", "..") for segment in root.split("/")):
        raise InvalidMetadataUriError(
            f"metadata URI {redact_uri(str(uri))!r}: its root {root} has a '.' or '..' segment, which ZooKeeper "
            f"paths do not take; write the root out, for example {DEFAULT_URI}")
    if root == ZOOKEEPER_TREE or root.startswith(ZOOKEEPER_TREE + "/"):
        raise InvalidMetadataUriError(
            f"metadata URI {redact_uri(str(uri))!r}: its root {root} is in {ZOOKEEPER_TREE}, the tree ZooKeeper "
            f"keeps for itself; choose another root, for example {DEFAULT_URI}")


def redact_uri(text: str) -> str:
    """text with the secret of every zk://user:secret@ URI in it replaced by ***, for logs and errors."""
    return _USERINFO.sub(r"\1***@", text)


@dataclasses.dataclass(frozen=True)
class ZkCredentials:
    """ZooKeeper digest authentication: the session authenticates as user, and every znode it creates is
    readable and writable by that user alone."""

    user: str
    secret: str = dataclasses.field(repr=False)

    @classmethod
    def parse(cls, text: str, where: str) -> "ZkCredentials":
        user, sep, secret = text.partition(":")
        if not sep or not user or not secret:
            raise InvalidMetadataUriError(f"{where} must be user:secret (ZooKeeper digest credentials)")
        return cls(user, secret)

    def auth_data(self) -> list[tuple[str, str]]:
        return [("digest", f"{self.user}:{self.secret}")]

    def acl(self) -> list:
        return [make_digest_acl(self.user, self.secret, all=True)]


@dataclasses.dataclass(frozen=True)
class MetadataUri:
    """zk://[user:secret@]host:port[,host:port...]/root; str() redacts the secret, uri() keeps it."""

    hosts: str
    root: str
    credentials: ZkCredentials | None = None

    @classmethod
    def parse(cls, uri: str) -> "MetadataUri":
        match = _URI.match(uri or "")
        if not match:
            raise InvalidMetadataUriError(
                f"metadata URI {redact_uri(str(uri))!r} is not of the form zk://host:port[,host:port...]/root, "
                f"for example {DEFAULT_URI} (with ZooKeeper credentials: zk://user:secret@host:port/root)"
                + (f"; {_ENCODE_USERINFO}" if "@" in str(uri) else "")
            )
        for host in match["hosts"].split(","):
            _check_host(uri, host)
        _check_root(uri, match["root"].rstrip("/"))
        credentials = None
        if match["user"]:
            credentials = ZkCredentials(urllib.parse.unquote(match["user"]), urllib.parse.unquote(match["secret"]))
        return cls(match["hosts"], match["root"].rstrip("/"), credentials)

    def uri(self) -> str:
        """The full URI, secret included: only to hand it to another MetadataStore (never to print it)."""
        if self.credentials is None:
            return f"zk://{self.hosts}{self.root}"
        user = urllib.parse.quote(self.credentials.user, safe="")
        secret = urllib.parse.quote(self.credentials.secret, safe="")
        return f"zk://{user}:{secret}@{self.hosts}{self.root}"

    def __str__(self) -> str:
        return redact_uri(self.uri())


def zk_credentials(uri: MetadataUri) -> ZkCredentials | None:
    """The URI's credentials, else those of $LEDGER_ZK_AUTH, else None (an open metadata tree)."""
    if uri.credentials is not None:
        return uri.credentials
    from_env = os.environ.get(ZK_AUTH_ENV)
    return ZkCredentials.parse(from_env, f"${ZK_AUTH_ENV}") if from_env else None


def zk_wait_seconds() -> float:
    """$LEDGER_ZK_WAIT_SECONDS, else DEFAULT_ZK_WAIT_SECONDS: how long a call waits for ZooKeeper to come back."""
    text = os.environ.get(ZK_WAIT_ENV)
    if not text:
        return DEFAULT_ZK_WAIT_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise MetadataError(f"${ZK_WAIT_ENV}={text!r}: give the seconds to wait for ZooKeeper, a number above 0")
    return seconds


@dataclasses.dataclass(frozen=True)
class RootInitialisation:
    """What initialise_root found or did: outcome "initialised" (created now), "already" (initialised before:
    nothing changed) or "adopted" (a root an older version made without a marker: marked now)."""

    outcome: str
    marker: layout.LayoutMarker


def initialise_root(uri: str, *, connect_timeout: float = 15.0) -> RootInitialisation:
    """Create the metadata root of uri with its layout directories and its marker (`ledger init`): the one
    thing that creates a root. Idempotent: on an initialised root it changes nothing. With credentials (in the
    URI or $LEDGER_ZK_AUTH) the whole tree is created readable and writable by them only."""
    with MetadataStore(uri, connect_timeout=connect_timeout, _initialise=True) as store:
        return RootInitialisation(store.init_outcome, store.layout)


def _answers(sent: list) -> list:
    """The replies of requests sent at once (kazoo's async results), in order; None for a znode not there."""
    found = []
    for reply in sent:
        try:
            found.append(reply.get())
        except NoNodeError:
            found.append(None)
    return found


def _names_stay(paths: list[str], exc: BaseException) -> None:
    log.warning("sequential znodes %s..%s stay until this ZooKeeper session ends: delete failed: %s",
                paths[0], paths[-1], exc)


def no_reply(exc: BaseException) -> bool:
    """exc is a request's MetadataError that got no answer: it may have taken effect or not (rule 16), so a
    caller that must know reads the record back once ZooKeeper is reachable again."""
    return isinstance(exc, MetadataError) and isinstance(exc.__cause__, NO_REPLY)


class MetadataStore:
    """One kazoo session, chrooted at the URI's root. Use as a context manager or call close().

    The root must have been initialised (initialise_root, `ledger init`): opening a root that does not exist or
    has no layout marker raises UninitialisedRootError naming it, and creates nothing. The check is one read.

    While ZooKeeper is unreachable a call waits for it, at most wait_seconds ($LEDGER_ZK_WAIT_SECONDS, default
    60 s), then raises ZooKeeperUnreachableError. A request is only sent on a connected session (kazoo would
    otherwise queue it until ZooKeeper came back, however long that takes), so a write that raises so was
    never sent. A read, or a write whose repetition changes nothing (set_data, delete, ensure_path), whose
    reply is lost to a dropped connection or an expired session is sent again on the next session within the
    same bound. Any other write whose reply is lost raises MetadataError with the kazoo error as its cause
    (no_reply() says so): it may have landed, and only its caller can tell, by reading the record back
    (update_loop.update_ledger, streams.update_stream; create_ledger reads back its own).

    With credentials (in the URI or $LEDGER_ZK_AUTH) the session authenticates by digest and every znode it
    creates (ledgers, streams, registrations; with initialise_root the root and its layout) carries an ACL that
    only those credentials satisfy, so a client without them can neither read nor change the metadata.
    """

    def __init__(self, uri: str, *, session_timeout: float = 10.0, connect_timeout: float = 15.0,
                 wait_seconds: float | None = None, _initialise: bool = False):
        self.uri = MetadataUri.parse(uri)
        self.credentials = zk_credentials(self.uri)
        self.wait_seconds = zk_wait_seconds() if wait_seconds is None else wait_seconds
        self._closed = False
        self.init_outcome: str | None = None  # what initialise_root() found or did
        self._ledger_ids = LedgerIds(self)
        if _initialise:
            self._ensure_root(connect_timeout)
        self.zk = self._client(
            self.uri.hosts + self.uri.root, session_timeout,
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, max_delay=1.0),
            command_retry=KazooRetry(max_tries=5, delay=0.1, max_delay=1.0, ignore_expire=False),
        )
        self._start(self.zk, connect_timeout)
        try:
            if self.credentials is not None:
                self._check_root_protected()   # before anything is written under it
            self.layout = self._initialise_layout() if _initialise else self._open_layout()
        except BaseException:
            self.close()
            raise

    def _client(self, hosts: str, timeout: float, **retries) -> KazooClient:
        if self.credentials is None:
            return KazooClient(hosts=hosts, timeout=timeout, **retries)
        return KazooClient(hosts=hosts, timeout=timeout, auth_data=self.credentials.auth_data(),
                           default_acl=self.credentials.acl(), **retries)

    def _check_root_protected(self) -> None:
        """Credentials on a root created without them would protect nothing: say so instead of pretending."""
        acls, _ = self._retried(self.zk.get_acls, "/")
        if any(acl.id.scheme == "world" for acl in acls):
            raise MetadataError(
                f"metadata root {self.uri.root} at {self.uri.hosts} was created without credentials and is open "
                "to every ZooKeeper client; use a new root with these credentials, or restrict the existing tree "
                "(zkCli: setAcl -R <root> digest:<user>:<digest>:cdrwa)"
            )

    def _start(self, client: KazooClient, connect_timeout: float) -> None:
        try:
            client.start(timeout=connect_timeout)
        except KazooTimeoutError as exc:
            client.close()
            raise MetadataError(
                f"cannot reach ZooKeeper at {self.uri.hosts} within {connect_timeout:.0f}s; "
                "is it running? (`ledger cluster start` starts a local one)"
            ) from exc
        except NoAuthError as exc:  # kazoo looks at a chrooted session's root as it starts
            client.stop()
            client.close()
            raise self._refused(exc) from exc

    def _refused(self, exc: NoAuthError) -> MetadataError:
        return MetadataError(
            f"ZooKeeper refused access to the metadata under {self.uri.root} (NoAuth): the tree is protected "
            f"by ACLs; give its credentials as zk://user:secret@host:port{self.uri.root} or in ${ZK_AUTH_ENV}"
        )

    # -- the root and its layout ------------------------------------------------------------------
    # A store never creates a root: `ledger init` (initialise_root) does, once, so that a mistyped root is an
    # error naming it instead of a new empty namespace that nodes register in and writers write to.

    def _open_layout(self) -> layout.LayoutMarker:
        """The root's layout marker, in one read. A root without one that holds the layout directories was made
        by a version from before markers (every store then created the directories): it counts as initialised
        and is marked now, as `ledger init` would (the same refusal of a root that holds anything but a ledger
        store's znodes, the same one multi). Any other root raises UninitialisedRootError."""
        try:
            data, _ = self._retried(self.zk.get, layout.MARKER)
        except NoNodeError:
            if self._retried(self.zk.exists, layout.LEDGERS) is None:
                raise UninitialisedRootError(self._uninitialised()) from None
            return self._initialise_layout()
        return self._checked_marker(data)

    def _checked_marker(self, data: bytes) -> layout.LayoutMarker:
        marker = layout.LayoutMarker.decode(data)
        if marker is None:
            raise MetadataFormatError(
                f"metadata root {self.uri.root} at {self.uri.hosts}: its {layout.MARKER} znode holds no layout record "
                "(damaged, or the root belongs to something else); check the metadata URI"
            )
        if marker.version > layout.LAYOUT_VERSION:
            raise MetadataError(
                f"metadata root {self.uri.root} at {self.uri.hosts} has layout version {marker.version}, newer than "
                f"this ledger-store knows ({layout.LAYOUT_VERSION}); upgrade ledger-store on this host"
            )
        if marker.version < layout.LAYOUT_VERSION:
            return self._upgrade_marker(marker)
        return marker

    def _upgrade_marker(self, previous: layout.LayoutMarker) -> layout.LayoutMarker:
        """A root of an older layout version: add the layout directories it lacks, then rewrite its marker
        (keeping its instance id)."""
        for path in layout.ALL_DIRS:
            self._retried(self.zk.ensure_path, path)
        marker = dataclasses.replace(previous, version=layout.LAYOUT_VERSION)
        self._retried(self.zk.set, layout.MARKER, marker.encode())
        return marker

    def _uninitialised(self) -> str:
        init = f"run `ledger init --metadata {self.uri}` to initialise it"
        if self._retried(self.zk.exists, "/") is None:
            return (f"metadata root {self.uri.root} does not exist at ZooKeeper {self.uri.hosts}: it was never "
                    f"initialised (or the URI names the wrong root); {init}")
        return (f"metadata root {self.uri.root} at ZooKeeper {self.uri.hosts} exists but was never initialised as a "
                f"ledger store (no {layout.MARKER} marker); check the URI, or {init}")

    def _ensure_root(self, connect_timeout: float) -> None:
        # The chroot itself must exist before a chrooted client can create anything in it.
        root_client = self._client(self.uri.hosts, 10.0)
        self._start(root_client, connect_timeout)
        try:
            self._translate(root_client.ensure_path, self.uri.root)
        finally:
            root_client.stop()
            root_client.close()

    def _initialise_layout(self) -> layout.LayoutMarker:
        """Create the layout directories and the marker in one multi, unless the marker is there. Refuses a root
        holding znodes that are not a ledger store's (another application's tree)."""
        ours = {path.lstrip("/") for path in (*layout.ALL_DIRS, layout.MARKER, layout.FEATURES)}
        for _ in range(5):
            try:
                data, _ = self._retried(self.zk.get, layout.MARKER)
            except NoNodeError:
                pass
            else:
                self.init_outcome = "already"
                return self._checked_marker(data)
            children = set(self._retried(self.zk.get_children, "/"))
            foreign = sorted(children - ours)
            if foreign:
                shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
                raise MetadataError(
                    f"metadata root {self.uri.root} at ZooKeeper {self.uri.hosts} holds znodes that are not a ledger "
                    f"store's ({shown}): it belongs to something else; choose another root"
                )
            marker = layout.LayoutMarker(layout.LAYOUT_VERSION, uuid.uuid4().hex, time.time())
            request = self.transaction()
            for path in layout.ALL_DIRS:
                if path.lstrip("/") not in children:
                    request.create(path)
            request.create(layout.MARKER, marker.encode())
            if layout.LEDGERS.lstrip("/") not in children:   # a new cluster: every client runs this version or later
                request.create(layout.FEATURES)
                for path in layout.KNOWN_FEATURES.values():
                    request.create(path)
            try:
                request.commit()
            except NodeExistsError:
                continue  # another `ledger init` (or an old-style store) at the same time: look again
            except MetadataError as exc:
                if not no_reply(exc):
                    raise
                continue  # may have landed: the marker says
            self.init_outcome = "adopted" if layout.LEDGERS.lstrip("/") in children else "initialised"
            return marker
        raise MetadataError(f"metadata root {self.uri.root} at ZooKeeper {self.uri.hosts} kept changing while it "
                            "was being initialised; retry `ledger init`")

    def enable_feature(self, path: str) -> bool:
        """Create a feature's znode (layout.KNOWN_FEATURES); whether it was not there before."""
        self.ensure_path(layout.FEATURES)
        return self.create_unless_there(path)

    def close(self) -> None:
        self._closed = True
        self.zk.stop()
        self.zk.close()

    def __enter__(self) -> "MetadataStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- generic versioned records -------------------------------------------------------------

    def read(self, path: str, decode: Callable[[bytes], object]) -> Versioned | None:
        found = self.read_with_stat(path, decode)
        return None if found is None else Versioned(found[0], found[1].version)

    def read_with_stat(self, path: str, decode: Callable[[bytes], object]) -> tuple[object, ZnodeStat] | None:
        """The decoded znode and its stat (version, mzxid, ...), in one request; None if it is not there."""
        try:
            data, stat = self._retried(self.zk.get, path)
        except NoNodeError:
            return None
        return decode(data), stat

    def read_within(self, path: str, decode: Callable[[bytes], object], seconds: float) -> Versioned | None:
        """read(), in one attempt that waits at most `seconds` for its answer and not at all for a session:
        MetadataError when the session is not connected or the answer is late. For a caller with something to
        fall back on that must not wait for ZooKeeper (the client's event loop)."""
        if not self.connected:
            raise MetadataError("ZooKeeper is not connected")
        try:
            data, stat = self._translate(lambda: self.zk.get_async(path).get(timeout=seconds))
        except NoNodeError:
            return None
        return Versioned(decode(data), stat.version)

    def children_within(self, path: str, seconds: float) -> list[str]:
        """children(), in one attempt that waits at most `seconds` (as read_within)."""
        if not self.connected:
            raise MetadataError("ZooKeeper is not connected")
        return self._translate(lambda: self.zk.get_children_async(path).get(timeout=seconds))

    def read_many_within(self, paths: list[str], decode: Callable[[bytes], object],
                         seconds: float) -> list[Versioned | None]:
        """read() of each path, all sent at once (pipelined) and answered within `seconds` together, in one attempt
        (as read_within): MetadataError when the session is not connected or an answer is late."""
        if not self.connected:
            raise MetadataError("ZooKeeper is not connected")
        deadline = time.monotonic() + seconds
        sent = [self.zk.get_async(path) for path in paths]
        found: list[Versioned | None] = []
        for reply in sent:
            try:
                data, stat = self._translate(lambda: reply.get(timeout=max(deadline - time.monotonic(), 0.0)))
            except NoNodeError:
                found.append(None)
                continue
            found.append(Versioned(decode(data), stat.version))
        return found

    def compare_and_set(self, path: str, data: bytes, expected_version: int, what: str) -> int:
        """Write data if the znode is still at expected_version; returns the new version."""
        try:
            stat = self._call(self.zk.set, path, data, version=expected_version)
        except BadVersionError as exc:
            raise MetadataConflictError(
                f"{what} changed since it was read (expected version {expected_version}); re-read and retry"
            ) from exc
        return stat.version

    # -- znodes --------------------------------------------------------------------------------
    # The one door to ZooKeeper for the rest of the tree. Like _call, these let kazoo's NoNodeError,
    # NodeExistsError and BadVersionError through (callers decide what absence means) and turn every other
    # ZooKeeper failure into MetadataError.

    @property
    def connected(self) -> bool:
        return self.zk.connected

    def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False, makepath: bool = False) -> str:
        return self._call(self.zk.create, path, data, ephemeral=ephemeral, makepath=makepath)

    def create_unless_there(self, path: str, data: bytes = b"") -> bool:
        """Create the znode unless it is there (never its parents: NoNodeError when one is gone); whether this call
        created it. A create whose reply was lost is sent again (found there, it changes nothing), so False may
        also mean that its first attempt created it: a caller that must know reads the znode's data."""
        try:
            self._retried(self.zk.create, path, data)
        except NodeExistsError:
            return False
        return True

    def set_data(self, path: str, data: bytes) -> None:
        """Overwrite a znode whatever its version (for records only their owner writes)."""
        self._retried(self.zk.set, path, data)

    def delete(self, path: str, *, recursive: bool = False) -> bool:
        """Delete a znode (with its children if recursive); False if it was not there (or a first attempt whose
        reply was lost deleted it)."""
        try:
            self._retried(self.zk.delete, path, recursive=recursive)
        except NoNodeError:
            return False
        return True

    def delete_created(self, path: str, created: int) -> bool:
        """Delete the znode at path that transaction `created` made (its stat's czxid), with its children; False
        if that znode is not there (gone, or another of the same name made since). For names that are used again
        (a stream made again after a delete): a request whose reply was lost is not simply sent again, as
        delete() does, since the znode may have gone with it and another taken its name meanwhile; every attempt
        first reads which znode holds the name. A znode created under it meanwhile (NotEmptyError) is raised to
        the caller, as delete() does."""
        while True:
            try:
                return self._retried(self._delete_created, path, created)
            except (NoNodeError, BadVersionError):
                continue   # changed while its children went: read again which znode holds the name

    def _delete_created(self, path: str, created: int) -> bool:
        # Lists the name's children: for `ledger stream delete` (an operator's command), never a commit, read or write.
        stat = self.zk.exists(path)
        if stat is None or stat.czxid != created:
            return False
        for child in self.zk.get_children(path):
            self.zk.delete(f"{path}/{child}", recursive=True)
        self.zk.delete(path, version=stat.version)
        return True

    def exists(self, path: str, watch: Callable | None = None) -> bool:
        """Whether the znode is there; watch(event) is called once it is created, changed or deleted."""
        return self._retried(self.zk.exists, path, watch=watch) is not None

    def modified_at(self, path: str) -> float | None:
        """When the znode was last written (ZooKeeper's mtime, by the server's clock), None if it is not there."""
        stat = self.stat(path)
        return None if stat is None else stat.mtime / 1000.0

    def stat(self, path: str) -> ZnodeStat | None:
        """The znode's stat (version, mtime, number of children), None if it is not there."""
        return self._retried(self.zk.exists, path)

    def children(self, path: str) -> list[str]:
        return self._retried(self.zk.get_children, path)

    def exist(self, paths: list[str]) -> list[bool]:
        """Whether each znode is there: an exists request each, pipelined (sent _PIPELINED at a time before their
        replies are awaited), so a few znodes cost a few small requests and about one round trip, not a listing
        of their parent."""
        return [stat is not None for stat in self.stats(paths)]

    def stats(self, paths: list[str]) -> list[ZnodeStat | None]:
        """Each znode's stat (None: not there), pipelined as exist() does."""
        return self._pipelined(self._stats, paths)

    def _pipelined(self, send: Callable[[list[str]], list], paths: list[str]) -> list:
        """send(paths) _PIPELINED paths at a time (each batch sent at once, then its replies awaited), each batch
        sent again after a lost reply (reads only)."""
        found: list = []
        for start in range(0, len(paths), _PIPELINED):
            found += self._retried(send, paths[start:start + _PIPELINED])
        return found

    def _stats(self, paths: list[str]) -> list[ZnodeStat | None]:
        sent = [self.zk.exists_async(path) for path in paths]
        return [reply.get() for reply in sent]

    def read_many(self, paths: list[str], decode: Callable[[bytes], object]) -> list[Versioned | None]:
        """read() of each path, pipelined as exist() is: a few znodes cost about one round trip."""
        return self._pipelined(lambda batch: self._read_many(batch, decode), paths)

    def _read_many(self, paths: list[str], decode: Callable[[bytes], object]) -> list[Versioned | None]:
        return [None if found is None else Versioned(decode(found[0]), found[1].version)
                for found in _answers([self.zk.get_async(path) for path in paths])]

    def listings(self, paths: list[str]) -> list[tuple[list[str], ZnodeStat] | None]:
        """Each znode's children and stat (None: not there), pipelined: one round trip for a few."""
        return self._retried(lambda: _answers([self.zk.get_children_async(path, include_data=True) for path in paths]))

    def ensure_path(self, path: str) -> None:
        self._retried(self.zk.ensure_path, path)

    def transaction(self) -> "Transaction":
        """Operations that ZooKeeper applies all or none of (a multi), in one request."""
        return Transaction(self)

    def add_listener(self, listener: Callable[[str], None]) -> None:
        """listener(state) on every session state change, on kazoo's event thread (which must not block)."""
        self.zk.add_listener(listener)

    def remove_listener(self, listener: Callable[[str], None]) -> None:
        self.zk.remove_listener(listener)

    def watch_data(self, path: str, changed: Callable) -> None:
        """changed(data, stat) now and on every change of the znode at path, across reconnects."""
        DataWatch(self.zk, path, changed)

    def wait_until_connected(self, deadline: float, since: float | None = None) -> None:
        """Return once the session is connected; ZooKeeperUnreachableError if it is not by deadline (monotonic;
        since: when ZooKeeper was first missed, for the message). A closed store, or one ZooKeeper refused to
        authenticate, does not wait: its calls fail at once."""
        started = time.monotonic() if since is None else since
        while not self.zk.connected:
            if self._closed or self.zk.client_state == KeeperState.AUTH_FAILED:
                return
            if time.monotonic() >= deadline:
                raise ZooKeeperUnreachableError(
                    f"ZooKeeper at {self.uri.hosts} was unreachable for {time.monotonic() - started:.0f}s "
                    f"(a metadata call waits for it at most {self.wait_seconds:g}s, ${ZK_WAIT_ENV}). Check that "
                    "ZooKeeper is running and reachable from this host, then retry"
                )
            time.sleep(_CONNECTED_POLL)

    def resync(self, path: str, deadline: float, since: float) -> None:
        """After a write whose reply was lost (at since): wait for the session until deadline, then `sync`, so
        that the next read sees the write if it landed. A request of the lost connection cannot land after
        that: ZooKeeper answers a session's requests in order, and drops them all when the session expires."""
        self._retried(self.zk.sync, path, deadline=deadline, since=since)

    def _call(self, fn, *args, **kwargs):
        """One request on a connected session (waiting wait_seconds for one); a lost reply raises."""
        self.wait_until_connected(time.monotonic() + self.wait_seconds)
        return self._translate(fn, *args, **kwargs)

    def _retried(self, fn, *args, deadline: float | None = None, since: float | None = None, **kwargs):
        """A request that may be sent twice (a read, or a write that changes nothing the second time): after a
        lost reply it is sent again once the session is connected, until deadline (default: wait_seconds)."""
        deadline = time.monotonic() + self.wait_seconds if deadline is None else deadline
        while True:
            self.wait_until_connected(deadline, since)
            try:
                return self._translate(fn, *args, **kwargs)
            except MetadataError as exc:
                if not no_reply(exc) or self._closed or time.monotonic() >= deadline:
                    raise
                since = since or time.monotonic()

    def _translate(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (NoNodeError, NodeExistsError, BadVersionError):
            raise
        except NoAuthError as exc:
            raise self._refused(exc) from exc
        except (KazooException, KazooTimeoutError) as exc:
            raise MetadataError(f"ZooKeeper request failed: {type(exc).__name__}: {exc}") from exc

    # -- ledgers -------------------------------------------------------------------------------

    def allocate_ledger_id(self) -> int:
        """A ledger id never handed out before (metadata/ledger_ids.py)."""
        return self._ledger_ids.take(1, 1)[0]

    def allocate_ledger_ids(self, count: int, per_request: int = 1000) -> list[int]:
        """count ids as allocate_ledger_id gives them, per_request at a time in two multis (create, delete):
        for tools that store many ledgers at once (the benchmarks' history fixtures)."""
        return self._ledger_ids.take(count, per_request)

    def sequence_names(self, prefix: str, count: int) -> list[str]:
        """Create count sequential znodes named prefix + ZooKeeper's sequence number, delete them, and return their
        paths (one create and one delete for one name; else a multi of each). They are ephemeral (as BookKeeper's
        ZkLedgerIdGenerator's): one whose create reply was lost, or whose delete failed, or whose process died in
        between, goes with this session instead of staying forever. The names are taken once the create
        returned, so a failed delete is logged, not raised; one name's delete is not waited for (the session's
        next request is answered after it: a new ledger's id costs one round trip, not two)."""
        if count == 1:
            path = self._call(self.zk.create, prefix, b"", ephemeral=True, sequence=True)
            self._delete_behind(path)
            return [path]
        create = self.transaction()
        for _ in range(count):
            create.create(prefix, ephemeral=True, sequence=True)
        paths = create.commit()
        try:
            delete = self.transaction()
            for path in paths:
                delete.delete(path)
            delete.commit()
        except (MetadataError, NoNodeError) as exc:
            _names_stay(paths, exc)
        return paths

    def _delete_behind(self, path: str) -> None:
        """Send the znode's delete and go on; one whose connection was lost is sent once more (kazoo sends it when
        the session is back: a client living for months would keep such znodes until its session ends), another
        failure is logged, from kazoo's thread."""
        def done(reply, again: bool = True) -> None:
            if reply.exception is None or isinstance(reply.exception, NoNodeError):
                return
            if again and isinstance(reply.exception, (ConnectionLoss, OperationTimeoutError)):   # sent once more:
                send(lambda second: done(second, again=False))   # kazoo holds it until the session is back
            else:
                _names_stay([path], reply.exception)

        def send(then) -> None:
            try:
                self.zk.delete_async(path).rawlink(then)
            except KazooException as exc:   # the session closed meanwhile: the ephemeral znode went with it
                _names_stay([path], exc)

        send(done)

    def create_ledger(self, meta: LedgerMetadata, placement_epoch: int | None = None) -> Versioned[LedgerMetadata]:
        """Allocate an id and store meta under it; meta.ledger_id is ignored. placement_epoch: that of the node
        list meta's ensemble was chosen from (registry.Placement); PlacementChangedError if a node was marked
        decommissioned since, and nothing is created."""
        ledger_id = self.allocate_ledger_id()
        meta = meta.replace(ledger_id=ledger_id, created_at=meta.created_at or time.time())

        def send() -> None:
            if placement_epoch is None:
                self._call(self.zk.create, layout.ledger_path(ledger_id), serde.encode_ledger(meta))
            else:
                request = self.transaction()
                request.check(layout.DECOMMISSIONED, placement_epoch)
                request.create(layout.ledger_path(ledger_id), serde.encode_ledger(meta))
                _placement_checked(request, placement_epoch)

        return self._created_ledger(meta, send)

    def create_ledger_guarded(self, meta: LedgerMetadata, guard: str,
                              placement_epoch: int | None = None) -> Versioned[LedgerMetadata]:
        """Store meta under meta.ledger_id (taken from allocate_ledger_id) in one multi with a check that the
        znode guard is still at version 0. Whoever bumps or deletes guard first thereby makes sure the ledger
        can never be created afterwards (the Spark task registries, connector/spark/jobs.py, rely on it).
        A changed or missing guard raises MetadataConflictError and creates nothing; placement_epoch as for
        create_ledger."""
        meta = meta.replace(created_at=meta.created_at or time.time())

        def send() -> None:
            request = self.transaction()
            if placement_epoch is not None:
                request.check(layout.DECOMMISSIONED, placement_epoch)
            request.check(guard, 0)
            request.create(layout.ledger_path(meta.ledger_id), serde.encode_ledger(meta))
            try:
                _placement_checked(request, placement_epoch)
            except (BadVersionError, NoNodeError) as exc:  # only the check can fail so: /ledgers exists
                raise MetadataConflictError(
                    f"ledger {meta.ledger_id} was not created: {guard} changed or is gone (its owner withdrew the id)"
                ) from exc

        return self._created_ledger(meta, send)

    def _created_ledger(self, meta: LedgerMetadata, send: Callable[[], None]) -> Versioned[LedgerMetadata]:
        """meta as stored by send() (the request that creates its znode). A create whose reply was lost may have
        landed (rule 16): then nobody but this caller knows the id, and the ledger would stay OPEN, written by no
        one, for good. So it is read back after a sync and adopted if it is the record sent (its writer and
        creation time; a recovery may have changed it since: adopted as it is then); else MetadataError (this call
        stored nothing), or ZooKeeperUnreachableError if ZooKeeper stays away (the outcome is unknown)."""
        try:
            send()
        except MetadataError as lost:
            if not no_reply(lost):
                raise
            found = self._read_back_created(meta.ledger_id, lost)
            if found is None or (found.value.writer_id, found.value.created_at) != (meta.writer_id, meta.created_at):
                what = "no ledger" if found is None else "another ledger"
                raise MetadataError(
                    f"ledger {meta.ledger_id} was not created: ZooKeeper lost the reply of its create, and a read-back "
                    f"found {what} under its id: this call stored nothing; create the ledger again") from lost
            return found
        return Versioned(meta, 0)

    def _read_back_created(self, ledger_id: int, lost: MetadataError) -> Versioned[LedgerMetadata] | None:
        """The ledger as stored after a sync (so that a create of the lost connection is seen if it landed)."""
        lost_at = time.monotonic()
        try:
            self.resync(layout.ledger_path(ledger_id), lost_at + self.wait_seconds, lost_at)
            return self.read(layout.ledger_path(ledger_id), serde.decode_ledger)
        except MetadataError as exc:
            if not (isinstance(exc, ZooKeeperUnreachableError) or no_reply(exc)):
                raise
            raise ZooKeeperUnreachableError(
                f"ledger {ledger_id}: ZooKeeper lost the reply of its create and stayed out of reach, so whether it "
                f"landed is unknown ({exc}); if it did, the ledger is OPEN with no writer: once ZooKeeper is back, "
                f"`ledger recover {ledger_id}` then `ledger delete {ledger_id}` remove it") from lost

    def read_ledger(self, ledger_id: int) -> Versioned[LedgerMetadata]:
        found = self.read(layout.ledger_path(ledger_id), serde.decode_ledger)
        if found is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist (deleted, or never created)")
        return found

    def read_ledger_async(self, ledger_id: int, *, synced: bool = False) -> concurrent.futures.Future:
        """read_ledger without blocking the caller: a Future of the ledger's Versioned metadata, or of None when
        there is none (never created, or deleted), set from kazoo's thread (asyncio.wrap_future awaits it on an
        event loop). synced: a ZooKeeper sync of the ledgers directory goes first, so that a session on a lagging
        follower sees every ledger created before the call (ZooKeeper answers a session's requests in order, so
        the read is sent at once behind it). One attempt, which the caller bounds in time: while the session
        reconnects kazoo holds the request and sends it once it is connected (a reply lost to the reconnection
        fails it, and so does a session that expired or closed); MetadataError in the Future when the request
        fails (no_reply() says whether it merely got no answer) or the record cannot be decoded."""
        path = layout.ledger_path(ledger_id)
        sync = self.zk.sync_async(layout.LEDGERS) if synced else None
        reply = self.zk.get_async(path)
        found: concurrent.futures.Future = concurrent.futures.Future()
        found.set_running_or_notify_cancel()       # sent: a waiter that gives up cancels its own wrapper only

        def done(_) -> None:
            try:
                if sync is not None:
                    self._translate(sync.get_nowait)   # answered before the read: it did not fail
                data, stat = self._translate(reply.get_nowait)
                found.set_result(Versioned(serde.decode_ledger(data), stat.version))
            except NoNodeError:
                found.set_result(None)
            except Exception as exc:   # MetadataError, or a record this version cannot decode
                found.set_exception(exc)

        reply.rawlink(done)
        return found

    def write_ledger(self, meta: LedgerMetadata, expected_version: int,
                     placement_epoch: int | None = None) -> Versioned[LedgerMetadata]:
        """Compare-and-set; placement_epoch (a write naming nodes chosen from registry.placement): in one multi
        with a check that no node was marked decommissioned since that list was read (PlacementChangedError)."""
        path, data = layout.ledger_path(meta.ledger_id), serde.encode_ledger(meta)
        try:
            if placement_epoch is None:
                version = self.compare_and_set(path, data, expected_version, f"ledger {meta.ledger_id} metadata")
            else:
                request = self.transaction()
                request.check(layout.DECOMMISSIONED, placement_epoch)
                request.set_data(path, data, expected_version)
                version = _placement_checked(request, placement_epoch)[-1].version
        except NoNodeError as exc:
            raise NoSuchLedgerError(f"ledger {meta.ledger_id} was deleted while being updated") from exc
        except BadVersionError as exc:
            raise MetadataConflictError(
                f"ledger {meta.ledger_id} metadata changed since it was read (expected version {expected_version}); "
                "re-read and retry") from exc
        return Versioned(meta, version)

    def delete_ledger(self, ledger_id: int, expected_version: int = -1) -> None:
        """Delete the ledger's record (at expected_version, -1: any); done as well when it is not there. A delete
        whose reply was lost is sent again: found gone then, it is done."""
        try:
            self._retried(self.zk.delete, layout.ledger_path(ledger_id), version=expected_version)
        except NoNodeError:
            return
        except BadVersionError as exc:
            raise MetadataConflictError(f"ledger {ledger_id} changed before it could be deleted") from exc

    def synced_children(self, paths: list[str]) -> list[list[str]]:
        """children() of each path after a sync() of it, every request sent at once: one round trip (ZooKeeper
        answers a session's requests in order, so each listing comes after its sync)."""
        return self._retried(self._synced_children, paths)

    def _synced_children(self, paths: list[str]) -> list[list[str]]:
        sent = [(self.zk.sync_async(path), self.zk.get_children_async(path)) for path in paths]
        for synced, _ in sent:
            synced.get()
        return [listed.get() for _, listed in sent]

    def sync(self, path: str) -> None:
        """ZooKeeper `sync`: this session's server catches up with the leader, so the reads that follow see
        every write committed before the call (a follower may otherwise lag behind; DESIGN rule 8)."""
        self._retried(self.zk.sync, path)

    def list_ledgers(self) -> list[int]:
        return sorted(layout.ledger_id_from_name(n) for n in self._retried(self.zk.get_children, layout.LEDGERS))

    def iter_ledgers(self) -> Iterator[Versioned[LedgerMetadata]]:
        for ledger_id in self.list_ledgers():
            try:
                yield self.read_ledger(ledger_id)
            except NoSuchLedgerError:
                continue


class Transaction:
    """A ZooKeeper multi: create, set_data, delete and check operations, then commit() applies all or none."""

    def __init__(self, store: MetadataStore):
        self._store = store
        self._request = store.zk.transaction()

    def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequence: bool = False) -> None:
        self._request.create(path, data, ephemeral=ephemeral, sequence=sequence)

    def set_data(self, path: str, data: bytes, version: int = -1) -> None:
        self._request.set_data(path, data, version)

    def delete(self, path: str, version: int = -1) -> None:
        self._request.delete(path, version)

    def check(self, path: str, version: int) -> None:
        self._request.check(path, version)

    def commit(self) -> list:
        """Apply every operation or none. Returns each operation's result in order (a create's path, a
        set_data's ZnodeStat); when none applied, raises the error of the operation that failed (as
        MetadataStore's methods do: kazoo's NoNodeError, NodeExistsError, BadVersionError pass through)."""
        results = self._store._call(self._request.commit)
        self._store._translate(_raise_failure, results)
        return results


def _raise_failure(results: list) -> None:
    # ZooKeeper answers a failed multi with one error per operation: RolledBackError for those before the
    # failing one, RuntimeInconsistency for those after it. The failing one's index goes with its error.
    for index, result in enumerate(results):
        if isinstance(result, Exception) and not isinstance(result, (RolledBackError, RuntimeInconsistency)):
            result.failed_operation = index
            raise result


def _placement_checked(request: Transaction, placement_epoch: int | None) -> list:
    """Commit a multi whose first operation, when placement_epoch is given, checks the placement epoch."""
    try:
        return request.commit()
    except BadVersionError as exc:
        if placement_epoch is not None and getattr(exc, "failed_operation", None) == 0:
            raise PlacementChangedError(
                "a storage node was marked decommissioned after the nodes for this write were chosen; nothing "
                "was written: choose the nodes again") from exc
        raise
