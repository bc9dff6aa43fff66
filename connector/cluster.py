"""A local cluster in one directory: the embedded ZooKeeper plus N storage node processes.

Used by `ledger cluster start|status|stop`, the demo, benchmarks and tests. Everything about a
cluster lives under its directory (cluster.json records ports and process ids), so starting again on
the same directory brings back the same nodes with all their data. Nodes are started by connector/node_launcher.py;
each writes DIR/nodes/NODE.ready once it serves and logs to DIR/nodes/NODE.log. With tls=True (`--tls`) a local CA and
certificates are created under DIR/tls and the nodes serve mutual TLS only; cluster.json records the files.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import signal
import socket
import time
from typing import Callable

import grpc

from connector.certificates import CertificateAuthority
from connector.client.security import TlsConfig, call_metadata
from connector.node_launcher import (
    NodeHandle, NodeStartError, launch, node_command, pid_alive, runs_node, wait_all_ready,
)
from metadata import layout, registry
from metadata.embedded import EmbeddedZooKeeper, four_letter_word, free_port, listens, runs_zookeeper
from metadata.errors import LedgerError
from metadata.model import NodeRegistration
from metadata.store import MetadataStore, initialise_root
from protos import ledger_pb2, ledger_pb2_grpc

STATE_FILE = "cluster.json"
PORT_RACE_ATTEMPTS = 3   # starts of a node again on another port, after another process took the one it was given
ROOT = "/ledgers"
TLS_DIR = "tls"


class ClusterError(LedgerError):
    """The local cluster could not be started, found or stopped."""


@dataclasses.dataclass
class NodeSpec:
    node_id: str
    port: int
    pid: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """PEM files of a cluster started with --tls: one CA, one node certificate for every node (it names
    127.0.0.1 and localhost), and a client certificate for the CLI, the demo and applications."""

    ca: str
    node_cert: str
    node_key: str
    client_cert: str
    client_key: str

    @classmethod
    def create(cls, directory: pathlib.Path) -> "TlsFiles":
        ca = CertificateAuthority.create(directory)
        node = ca.issue(directory, "node")
        client = ca.issue(directory, "client", hosts=(), client=True)
        return cls(str(ca.cert), str(node.cert), str(node.key), str(client.cert), str(client.key))

    def node_args(self) -> list[str]:
        return ["--tls-cert", self.node_cert, "--tls-key", self.node_key, "--tls-ca", self.ca]

    def client(self) -> TlsConfig:
        return TlsConfig(ca=self.ca, cert=self.client_cert, key=self.client_key)


@dataclasses.dataclass
class ClusterState:
    zk_port: int
    zk_pid: int = 0
    nodes: list[NodeSpec] = dataclasses.field(default_factory=list)
    tls: TlsFiles | None = None

    @property
    def metadata_uri(self) -> str:
        return f"zk://127.0.0.1:{self.zk_port}{ROOT}"


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on host:port. SO_REUSEADDR as the nodes' gRPC server binds, so the
    TIME_WAIT connections of a node that just stopped do not count."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def wait_gone(pid: int, timeout: float, alive: Callable[[int], bool] = pid_alive) -> bool:
    """Until alive(pid) is false (default: no process has the pid), at most timeout seconds; whether it is."""
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


class LocalCluster:
    """Start, inspect and stop the cluster kept in `directory`."""

    def __init__(self, directory: str | os.PathLike, nodes: int = 3, node_args: tuple[str, ...] = (),
                 tls: bool = False):
        self.directory = pathlib.Path(directory).resolve()
        self.node_count = nodes
        self.node_args = tuple(node_args)
        self.tls = tls
        self.state: ClusterState | None = self._load()
        self.notes: list[str] = []              # what start() repaired on its way, for the operator
        self._started: dict[str, NodeHandle] = {}   # the nodes this object started, by id
        self._started_zookeeper: EmbeddedZooKeeper | None = None   # the ZooKeeper this object started

    # -- state file ----------------------------------------------------------------------------

    @property
    def state_file(self) -> pathlib.Path:
        return self.directory / STATE_FILE

    def _load(self) -> ClusterState | None:
        if not self.state_file.exists():
            return None
        try:
            return decode_state(json.loads(self.state_file.read_text(encoding="utf-8")))
        except OSError as exc:
            raise ClusterError(f"cannot read {self.state_file}: {exc.strerror}") from None
        except ValueError as exc:
            raise ClusterError(
                f"{self.state_file} is damaged ({_damage(exc)}): restore it, or stop the cluster's processes (its "
                "ZooKeeper and nodes) and start a new cluster with an empty --dir") from None

    def _save(self) -> None:
        assert self.state is not None
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(self.state), indent=2))
        tmp.replace(self.state_file)

    @property
    def metadata_uri(self) -> str:
        if self.state is None:
            raise ClusterError(f"no cluster in {self.directory}: run `ledger cluster start --dir {self.directory}`")
        return self.state.metadata_uri

    def _recorded(self) -> ClusterState:
        """The state of a cluster started here before, for status and stop."""
        if self.state is None:
            raise ClusterError(f"no cluster in {self.directory} (no {STATE_FILE} there): run the command from the "
                               "directory where `ledger cluster start` ran, or pass --dir with that path")
        return self.state

    @property
    def client_tls(self) -> TlsConfig | None:
        """What a client needs to talk to this cluster's nodes (None: plain text)."""
        return self.state.tls.client() if self.state is not None and self.state.tls is not None else None

    def node_dir(self, node_id: str) -> pathlib.Path:
        return self.directory / "nodes" / node_id

    # -- start ---------------------------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> str:
        """Start whatever is not running, the metadata root initialised; returns the metadata URI once every
        node is registered."""
        self._make_directory()
        new = self.state is None
        if new:
            self.state = ClusterState(zk_port=free_port())
        if self.tls and self.state.tls is None:
            running = [s.node_id for s in self.state.nodes if self.node_runs(s)]
            if running:
                raise ClusterError(f"node(s) {', '.join(running)} of {self.directory} run without TLS: "
                                   f"`ledger cluster stop --dir {self.directory}` first, then start with --tls")
            self.state.tls = TlsFiles.create(self.directory / TLS_DIR)
        wanted = max(self.node_count, len(self.state.nodes))
        while len(self.state.nodes) < wanted:
            self.state.nodes.append(NodeSpec(f"node-{len(self.state.nodes) + 1}", self._unrecorded_port()))
        self._save()
        running_before = dict(self._started)
        zookeeper_before = self._started_zookeeper
        try:
            self.start_zookeeper(timeout, may_move=new)
            initialise_root(self.metadata_uri)  # `ledger init`: idempotent, and the nodes refuse a root without it
            for spec in self.state.nodes:
                self.start_node(spec.node_id)
            self.wait_serving(timeout)
        except BaseException:
            self._stop_started(running_before, zookeeper_before)
            raise
        return self.metadata_uri

    def _stop_started(self, running_before: dict[str, NodeHandle], zookeeper_before) -> None:
        """A start that failed stops what it started (its nodes, then its ZooKeeper) rather than leave a half-started
        cluster running; processes that ran before it are left as they were."""
        for spec in self.state.nodes:
            handle = self._started.get(spec.node_id)
            if handle is not None and running_before.get(spec.node_id) is not handle:
                handle.stop()
                del self._started[spec.node_id]
                spec.pid = 0
        if self._started_zookeeper is not None and self._started_zookeeper is not zookeeper_before:
            self._started_zookeeper.stop()
            self._started_zookeeper = None
            self.state.zk_pid = 0
        self._save()

    def _make_directory(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ClusterError(f"--dir {self.directory}: a file is in the way; give --dir a directory (a new one, "
                               "or the one of a cluster started before)") from None
        except OSError as exc:
            raise ClusterError(f"--dir {self.directory}: cannot create it ({exc.strerror}); give --dir a "
                               "directory this user can write") from None

    def start_zookeeper(self, timeout: float = 90.0, may_move: bool = False) -> None:
        """Start the embedded ZooKeeper on its recorded port and data unless it is serving. may_move: a new
        cluster, whose port nobody has been told yet, moves to another free port if another process took it."""
        if self._zookeeper_serving():
            return
        zk = EmbeddedZooKeeper(self.directory / "zookeeper", port=self.state.zk_port,
                               pick_port=self._unrecorded_port if may_move else None)
        zk.start(detach=True, timeout=timeout)
        self._started_zookeeper = zk
        if zk.port != self.state.zk_port:
            self.notes.append(f"zookeeper: port {self.state.zk_port} is taken by another process; moved to port "
                              f"{zk.port}")
            self.state.zk_port = zk.port
        self.state.zk_pid = zk.process.pid
        self._save()

    def start_node(self, node_id: str) -> int:
        """Start one recorded node unless its process is alive (it registers on its own); its pid."""
        spec = self.node(node_id)
        if not self.node_runs(spec):
            self._move_off_a_taken_port(spec)
            spec.pid = self._start_node(spec)
            self._save()
        return spec.pid

    def _move_off_a_taken_port(self, spec: NodeSpec) -> None:
        """A node whose recorded port another process took would fail every start (issue 15 item 7). Ledgers
        name nodes by id and clients find the address in the node's registration, so the node can move."""
        if port_in_use(spec.port):
            old, spec.port = spec.port, self._unrecorded_port()
            self.notes.append(f"{spec.node_id}: port {old} is taken by another process; moved to port {spec.port}")

    def _unrecorded_port(self) -> int:
        """A free port that no node (nor ZooKeeper) of this cluster has recorded: each free_port() call frees its
        port again, and the kernel may hand the same one out twice (seen: node-1 and node-2 of a new cluster
        both given 57295, and one of them refused to start)."""
        recorded = {self.state.zk_port, *(spec.port for spec in self.state.nodes)}
        return distinct_port(recorded)

    def node(self, node_id: str) -> NodeSpec:
        for spec in self.state.nodes if self.state is not None else ():
            if spec.node_id == node_id:
                return spec
        raise ClusterError(f"no node {node_id!r} in {self.directory}")

    def node_runs(self, spec: NodeSpec) -> bool:
        """Whether the node's recorded pid is this cluster's node (not a process that has the pid since a reboot)."""
        return runs_node(spec.pid, self.node_dir(spec.node_id))

    def _zookeeper_runs(self) -> bool:
        """Whether the recorded ZooKeeper pid is this cluster's ZooKeeper, as node_runs is for a node."""
        return runs_zookeeper(self.state.zk_pid, self.directory / "zookeeper")

    def _zookeeper_serving(self) -> bool:
        """Whether this cluster's ZooKeeper answers: the process it recorded, not another one that took the port."""
        if not (self._zookeeper_runs() and listens(self.state.zk_pid, "127.0.0.1", self.state.zk_port)):
            return False
        try:
            return four_letter_word("127.0.0.1", self.state.zk_port) == b"imok"
        except OSError:
            return False

    def _start_node(self, spec: NodeSpec) -> int:
        data_dir = self.node_dir(spec.node_id)
        data_dir.mkdir(parents=True, exist_ok=True)
        command = node_command(data_dir, spec.port, self.metadata_uri, spec.node_id,
                               *(self.state.tls.node_args() if self.state.tls else ()), *self.node_args)
        handle = launch(command, spec.node_id, ready_file=self.ready_file(spec.node_id),
                        log_file=self.log_file(spec.node_id), new_session=True)
        self._started[spec.node_id] = handle
        return handle.pid

    def _attach(self, spec: NodeSpec) -> NodeHandle:
        """A node that an earlier `cluster start` started (or is starting)."""
        return NodeHandle.attach(spec.node_id, spec.pid, self.ready_file(spec.node_id), self.log_file(spec.node_id))

    def log_file(self, node_id: str) -> pathlib.Path:
        return self.directory / "nodes" / f"{node_id}.log"

    def ready_file(self, node_id: str) -> pathlib.Path:
        """Written by the node once it is registered and serves; removed when it stops."""
        return self.directory / "nodes" / f"{node_id}.ready"

    def wait_serving(self, timeout: float) -> None:
        """Until every node serves (registered: its ready file names its pid). A node that exits meanwhile
        fails the start in its own words (its refusal says what is wrong and what to do), unless it found its port
        taken: then it moves to another and starts again, up to PORT_RACE_ATTEMPTS times."""
        for attempt in range(PORT_RACE_ATTEMPTS + 1):
            handles = [self._started.get(spec.node_id) or self._attach(spec) for spec in self.state.nodes]
            try:
                wait_all_ready(handles, timeout)
                return
            except NodeStartError as exc:
                if attempt == PORT_RACE_ATTEMPTS or not self._move_nodes_whose_port_was_taken():
                    raise ClusterError(str(exc)) from None

    def _move_nodes_whose_port_was_taken(self) -> bool:
        """Start again, on another port, the nodes this object started that refused to start because their port
        was taken. A port is free when it is picked (and checked again before the start), not when the node binds
        it about a second later: in a CI run, another test's process took one in between. True if any moved."""
        moved = False
        for spec in self.state.nodes:
            handle = self._started.get(spec.node_id)
            if handle is not None and handle.port_taken():
                old, spec.port = spec.port, self._unrecorded_port()
                self.notes.append(f"{spec.node_id}: port {old} was taken while it started; moved to port {spec.port}")
                spec.pid = self._start_node(spec)
                self._save()
                moved = True
        return moved

    # -- status --------------------------------------------------------------------------------

    def status(self, tls: TlsConfig | None = None, auth_token: str | None = None) -> dict:
        """tls: override the cluster's own client certificate (default: the one cluster.json records)."""
        state = self._recorded()
        tls = tls or self.client_tls
        result = {"metadata": state.metadata_uri, "zookeeper": self._zookeeper_serving(), "nodes": [],
                  "tls": state.tls is not None}
        registered: dict[str, NodeRegistration] = {}
        if result["zookeeper"]:
            with MetadataStore(state.metadata_uri) as store:
                registered = registry.list_nodes(store)
        for spec in state.nodes:
            reg = registered.get(spec.node_id)
            entry = {
                "node_id": spec.node_id,
                "pid": spec.pid,
                "running": self.node_runs(spec),
                "registered": reg is not None,
                "state": reg.state.value if reg else "-",
                "address": reg.address if reg else spec.address,
                "metrics_address": reg.metrics_address if reg else "",
                "health": reg.health if reg else "-",
            }
            entry.update(node_info(entry["address"], tls, auth_token) if entry["running"] else {})
            result["nodes"].append(entry)
        return result

    # -- stop ----------------------------------------------------------------------------------

    def stop(self, timeout: float = 30.0) -> None:
        """Clean shutdown: nodes first (they checkpoint and deregister), then ZooKeeper. Nodes still running
        `timeout` seconds after SIGTERM (one deadline for all: a node cannot deregister while ZooKeeper is
        down) are killed. Only the cluster's own processes are signalled: a recorded pid that another process has
        now (after a reboot) is left alone and forgotten."""
        self._recorded()
        running = [spec for spec in self.state.nodes if self.node_runs(spec)]
        for spec in running:
            _signal(spec.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for spec in running:
            alive = functools.partial(runs_node, data_dir=self.node_dir(spec.node_id))
            if not wait_gone(spec.pid, max(0.0, deadline - time.monotonic()), alive):
                _signal(spec.pid, signal.SIGKILL)
                wait_gone(spec.pid, 10, alive)
        for spec in self.state.nodes:
            spec.pid = 0
        if self._zookeeper_runs():
            _signal(self.state.zk_pid, signal.SIGTERM)
            alive = functools.partial(runs_zookeeper, data_dir=self.directory / "zookeeper")
            if not wait_gone(self.state.zk_pid, timeout, alive):
                _signal(self.state.zk_pid, signal.SIGKILL)
        self.state.zk_pid = 0
        self._save()

    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:   # it exited meanwhile
        pass


def decode_state(raw: object) -> ClusterState:
    """cluster.json's record; ValueError saying what is wrong with it (checked before anything is started on it)."""
    if not (isinstance(raw, dict) and _is_int(raw.get("zk_port")) and _is_int(raw.get("zk_pid", 0))
            and isinstance(raw.get("nodes"), list)):
        raise ValueError("not an object with zk_port and zk_pid numbers and a nodes list")
    try:
        nodes = [NodeSpec(**node) for node in raw["nodes"]]
        tls = TlsFiles(**raw["tls"]) if raw.get("tls") else None
    except TypeError as exc:   # a node or the tls entry not an object, or with other fields than recorded
        raise ValueError(f"a node or its tls entry is not as recorded: {exc}") from None
    if not all(_is_int(node.port) and _is_int(node.pid) for node in nodes):
        raise ValueError("a node's port or pid is not a number")
    for what, port in (("zk_port", raw["zk_port"]), *((f"the port of node {n.node_id!r}", n.port) for n in nodes)):
        if not 0 < port < 65536:
            raise ValueError(f"{what} is {port}, not a port in 1-65535")
    if raw.get("zk_pid", 0) < 0 or any(node.pid < 0 for node in nodes):
        raise ValueError("a pid is negative")
    for node in nodes:
        if not layout.is_node_id(node.node_id):
            raise ValueError(f"node id {node.node_id!r} is not one ({layout.NODE_ID_RULE})")
    if len({node.node_id for node in nodes}) < len(nodes):
        raise ValueError("a node id is recorded twice")
    if tls is not None and not all(isinstance(path, str) and path for path in dataclasses.astuple(tls)):
        raise ValueError("a tls entry is not a file name")
    return ClusterState(raw["zk_port"], raw.get("zk_pid", 0), nodes, tls)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)   # JSON true is no number


def _damage(exc: ValueError) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON: {exc}"
    return str(exc)


def node_info(address: str, tls: TlsConfig | None = None, auth_token: str | None = None,
              timeout: float = 2.0) -> dict:
    """What a node says about itself (disk use, role), or an 'error' entry if it does not answer."""
    try:
        channel = (grpc.insecure_channel(address) if tls is None
                   else grpc.secure_channel(address, tls.channel_credentials()))
        with channel:
            info = ledger_pb2_grpc.StorageNodeStub(channel).NodeInfo(
                ledger_pb2.NodeInfoRequest(), timeout=timeout, metadata=call_metadata(auth_token))
    except grpc.RpcError as exc:
        return {"error": exc.code().name}
    return {
        "read_only": info.read_only,
        "read_only_reason": info.read_only_reason,
        "disk_used_bytes": info.disk_used_bytes,
        "disk_total_bytes": info.disk_total_bytes,
        "ledgers": info.ledger_count,
        "entries": info.entry_count,
    }


def distinct_port(recorded: set[int], pick: Callable[[], int] = free_port, attempts: int = 100) -> int:
    """A port from pick() that is not among recorded."""
    for _ in range(attempts):
        port = pick()
        if port not in recorded:
            return port
    raise ClusterError(f"no free port outside the {len(recorded)} this cluster recorded after {attempts} tries")
