"""A real ZooKeeper server launched from the jars inside the installed pyspark wheel.

No extra install: pyspark ships zookeeper-3.9 and its logging jars. Used by `ledger cluster start`,
the demo and the tests. Its heap is 256 MiB, or $ZK_SERVER_HEAP MiB (the variable ZooKeeper's own
scripts read): ZooKeeper keeps every znode in memory, and a cluster of 200,000 ledgers took 690 MiB
(`ledger bench history`), so one of more than about 70,000 ledgers needs more.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time
from typing import Callable

import psutil

from metadata.errors import EmbeddedZooKeeperError, ZooKeeperPortTakenError

MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
CONFIG_FILE = "zoo.cfg"   # in the data directory: the one argument after MAIN_CLASS
HEAP_ENV = "ZK_SERVER_HEAP"
DEFAULT_HEAP_MB = 256
# A port free_port() chose is free when chosen, not when the JVM binds it a second or more later: another process
# (any client's outgoing connection takes one from the same ephemeral range) may take it in between. Seen in CI.
PORT_ATTEMPTS = 5
BIND_FAILURE = b"java.net.BindException"


def pyspark_jars_dir() -> pathlib.Path:
    import pyspark

    jars = pathlib.Path(pyspark.__file__).resolve().parent / "jars"
    if not any(jars.glob("zookeeper-*.jar")):
        raise EmbeddedZooKeeperError(f"no zookeeper jar in {jars}; reinstall pyspark (pip install pyspark==4.3.0)")
    return jars


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def listens(pid: int, host: str, port: int) -> bool:
    """Whether process pid has a TCP socket listening on host:port: that a ZooKeeper answering there is that
    process, not another one (another test's or cluster's) that holds the port."""
    if pid <= 0:
        return False
    try:
        sockets = psutil.Process(pid).net_connections(kind="tcp")
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False
    return any(s.status == psutil.CONN_LISTEN and s.laddr and s.laddr.port == port
               and s.laddr.ip in (host, f"::ffff:{host}", "0.0.0.0", "::") for s in sockets)   # Java: IPv6-mapped


def command_line(pid: int) -> list[str]:
    """Process pid's arguments; [] once it is gone (or a zombie) or when they cannot be read."""
    if pid <= 0:
        return []
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def runs_zookeeper(pid: int, data_dir: str | os.PathLike) -> bool:
    """Whether process pid is the embedded ZooKeeper of data_dir (QuorumPeerMain reading DATA_DIR/zoo.cfg): a pid
    recorded before a reboot may be any other process's now, and must not be signalled as ZooKeeper."""
    argv = command_line(pid)
    config = os.path.realpath(pathlib.Path(data_dir) / CONFIG_FILE)
    return MAIN_CLASS in argv and any(os.path.realpath(arg) == config for arg in argv[argv.index(MAIN_CLASS) + 1:])


def four_letter_word(host: str, port: int, word: bytes = b"ruok", timeout: float = 1.0) -> bytes:
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(word)
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
        return b"".join(chunks)


def read_from(path: pathlib.Path, offset: int) -> bytes:
    with open(path, "rb") as file:
        file.seek(offset)
        return file.read()


class EmbeddedZooKeeper:
    """One standalone ZooKeeper server with its own data directory on 127.0.0.1."""

    def __init__(self, data_dir: str | os.PathLike, port: int = 0, host: str = "127.0.0.1",
                 pick_port: Callable[[], int] | None = None):
        """port 0: a free one, chosen here. pick_port: how to choose another if another process takes the port
        before ZooKeeper binds it on its first start (default: a free one when the port was chosen here; none,
        and the start fails naming the port, when it was given)."""
        self.data_dir = pathlib.Path(data_dir).resolve()
        self.host = host
        self.port = port or free_port(host)
        self.pick_port = pick_port or (None if port else lambda: free_port(host))
        self.process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def uri(self, root: str = "/ledgers") -> str:
        return f"zk://{self.address}{root}"

    def write_config(self) -> pathlib.Path:
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        config = self.data_dir / CONFIG_FILE
        config.write_text(
            "\n".join(
                [
                    "tickTime=500",
                    "initLimit=10",
                    "syncLimit=5",
                    f"dataDir={self.data_dir / 'data'}",
                    f"clientPort={self.port}",
                    f"clientPortAddress={self.host}",
                    "maxClientCnxns=0",
                    "minSessionTimeout=1000",
                    "maxSessionTimeout=60000",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=ruok,stat,srvr,mntr,cons",
                    "autopurge.purgeInterval=1",
                    "",
                ]
            )
        )
        return config

    def command(self) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise EmbeddedZooKeeperError("java not found on PATH: Java 17 is required to run the embedded ZooKeeper")
        jars = pyspark_jars_dir()
        return [
            java,
            f"-Xmx{int(os.environ.get(HEAP_ENV) or DEFAULT_HEAP_MB)}m",
            "-XX:+UseSerialGC",
            "-Dzookeeper.admin.enableServer=false",
            f"-Dzookeeper.log.dir={self.data_dir}",
            "-cp",
            f"{jars}/*",
            MAIN_CLASS,
            str(self.write_config()),
        ]

    def start(self, *, detach: bool = False, timeout: float = 60.0) -> "EmbeddedZooKeeper":
        """Start the server and wait until it answers; detach=True outlives this process. On the first start a
        port another process took is replaced by pick_port's (if any); a started server keeps its port, which
        its clients were given, on every later start."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                self._start_once(detach, timeout)
            except ZooKeeperPortTakenError:
                if self.pick_port is None or attempt == PORT_ATTEMPTS:
                    raise
                self.port = self.pick_port()
                continue
            self.pick_port = None
            return self
        raise AssertionError("unreachable")

    def _start_once(self, detach: bool, timeout: float) -> "EmbeddedZooKeeper":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.data_dir / "zookeeper.log"
        with open(log_path, "ab") as log:
            log_start = log.tell()
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=detach,
            )
        (self.data_dir / "zookeeper.pid").write_text(str(self.process.pid))
        try:
            self.wait_until_serving(timeout)
        except EmbeddedZooKeeperError:
            if self.process.poll() is None:      # it did not answer in time: no server is left behind
                self.process.kill()
                self.process.wait()
            elif BIND_FAILURE in read_from(log_path, log_start):
                raise ZooKeeperPortTakenError(
                    f"ZooKeeper could not listen on {self.address}: another process holds that port; "
                    f"stop it or choose another port (see {log_path})"
                ) from None
            raise
        return self

    def wait_until_serving(self, timeout: float = 60.0) -> None:
        """Until this server answers. The answer counts once this process listens on the port: another
        ZooKeeper that holds the port (one of another test or cluster) answers `imok` as well, while this one
        fails to bind it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise EmbeddedZooKeeperError(
                    f"ZooKeeper exited with code {self.process.returncode}; see {self.data_dir / 'zookeeper.log'}"
                )
            try:
                if four_letter_word(self.host, self.port) == b"imok" and (
                        self.process is None or listens(self.process.pid, self.host, self.port)):
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise EmbeddedZooKeeperError(
            f"ZooKeeper did not answer on {self.address} within {timeout:.0f}s; see {self.data_dir / 'zookeeper.log'}"
        )

    def stop(self, timeout: float = 20.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
        self.process = None

    def __enter__(self) -> "EmbeddedZooKeeper":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
