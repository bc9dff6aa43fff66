"""A loopback TCP proxy for network faults (DESIGN section 7): put it in front of ZooKeeper or a storage node
and switch, at run time, what happens to the bytes between the clients and the target.

    with TcpProxy("127.0.0.1", zookeeper.port) as proxy:
        uri = f"zk://{proxy.address}/root"          # clients connect to the proxy, not to the target
        proxy.set_mode("drop", direction=S2C)       # requests arrive, replies are lost
        proxy.set_mode("pass")
        proxy.reset()                               # every current connection is reset; clients reconnect

set_mode(mode, direction=BOTH, seconds=0.0) applies to the current connections and to new ones; a direction
is C2S (client -> server), S2C (server -> client) or BOTH:

- pass: forward bytes as they come.
- delay: forward every chunk `seconds` after it arrived, in order. Chunks already queued keep their time
  when the mode changes.
- drop: swallow the bytes silently; the connection stays open (a silent partition, one-way or both). The
  bytes are gone for good, so a framed protocol is out of step after healing: reset() then.
- cut: the receiving side gets end-of-file now (a FIN: the direction is half-closed) and later bytes are
  discarded. A cut connection stays cut; connections made while the mode is set are cut at once.
- blackhole (always both directions): new connections are accepted and never connected to the target,
  every byte of every connection is swallowed, nothing answers. A connection accepted during a blackhole
  stays dead after the mode changes; the client must reconnect.

reset() closes every current connection abruptly (RST to both sides), discarding queued bytes.
stats() counts connections and bytes per direction (received, forwarded, dropped), for tests that wait
until a request has passed or been swallowed.

The proxy runs its own asyncio loop in a daemon thread. Every call from the caller's thread waits at most
`timeout` seconds, connecting to the target at most `connect_timeout`, and a write a peer does not read
for `write_timeout` closes that connection; close() stops everything within `timeout`.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import struct
import threading

C2S = "c2s"
S2C = "s2c"
BOTH = "both"
MODES = ("pass", "delay", "drop", "cut", "blackhole")
_EOF = object()


@dataclasses.dataclass(frozen=True)
class ProxyStats:
    """Counters since the proxy started; byte counts are keyed by direction (C2S, S2C)."""

    accepted: int
    open: int
    received: dict[str, int]
    forwarded: dict[str, int]
    dropped: dict[str, int]


@dataclasses.dataclass(frozen=True)
class _Rule:
    mode: str = "pass"
    seconds: float = 0.0


class _Connection:
    """One client connection and, unless it was accepted into a blackhole, its connection to the target."""

    def __init__(self, client: tuple[asyncio.StreamReader, asyncio.StreamWriter], handler: asyncio.Task):
        self.handler = handler
        self.aborted = False
        self.readers = {C2S: client[0], S2C: None}
        self.writers = {C2S: None, S2C: client[1]}  # keyed by the direction whose bytes they write
        self.queues = {C2S: asyncio.Queue(), S2C: asyncio.Queue()}
        self.cut: set[str] = set()
        self.tasks: list[asyncio.Task] = []

    @property
    def blackholed(self) -> bool:
        return self.readers[S2C] is None

    def failed(self) -> bool:
        """Reset, or a task failed (a write timed out, a socket error): close abruptly."""
        return self.aborted or any(t.done() and not t.cancelled() and t.exception() for t in self.tasks)

    def transports(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.writers[S2C], self.writers[C2S]) if w is not None]


class TcpProxy:
    """Listens on host:port (port 0: a free one) and forwards every connection to target_host:target_port."""

    def __init__(self, target_host: str, target_port: int, host: str = "127.0.0.1", port: int = 0, *,
                 timeout: float = 10.0, connect_timeout: float = 5.0, write_timeout: float = 30.0):
        self.target = (target_host, target_port)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.write_timeout = write_timeout
        self._bind = (host, port)
        self._rules = {C2S: _Rule(), S2C: _Rule()}
        self._connections: set[_Connection] = set()
        self._accepted = 0
        self._received = {C2S: 0, S2C: 0}
        self._forwarded = {C2S: 0, S2C: 0}
        self._dropped = {C2S: 0, S2C: 0}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self.host, self.port = host, 0

    # -- the caller's side -------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """host:port that clients connect to."""
        return f"{self.host}:{self.port}"

    def start(self) -> "TcpProxy":
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name=f"tcp-proxy->{self.target[1]}", daemon=True)
        self._thread.start()
        try:
            self._run(self._listen())
        except BaseException:
            self.close()
            raise
        return self

    def set_mode(self, mode: str, direction: str = BOTH, seconds: float = 0.0) -> None:
        """Switch what happens to the bytes of `direction` (see the module docstring)."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: allowed modes are {', '.join(MODES)}")
        if direction not in (C2S, S2C, BOTH):
            raise ValueError(f"direction {direction!r}: allowed directions are {C2S}, {S2C}, {BOTH}")
        if mode == "delay" and seconds <= 0:
            raise ValueError("mode 'delay' needs seconds > 0")
        directions = (C2S, S2C) if direction == BOTH or mode == "blackhole" else (direction,)
        self._run(self._set(_Rule(mode, seconds if mode == "delay" else 0.0), directions))

    def reset(self) -> None:
        """Close every current connection abruptly (RST), on the client's side and on the target's."""
        self._run(self._reset())

    def stats(self) -> ProxyStats:
        return self._run(self._stats())

    def close(self) -> None:
        if self._loop is None:
            return
        loop, self._loop = self._loop, None
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(self.timeout)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(self.timeout)
        if not self._thread.is_alive():
            loop.close()

    def __enter__(self) -> "TcpProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self, coroutine):
        if self._loop is None:
            coroutine.close()
            raise RuntimeError("the proxy is not running: call start() or use it as a context manager")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(self.timeout)

    # -- the loop's side ---------------------------------------------------------------------------

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, *self._bind)
        self.host, self.port = self._server.sockets[0].getsockname()[:2]

    async def _stats(self) -> ProxyStats:
        return ProxyStats(self._accepted, len(self._connections), dict(self._received), dict(self._forwarded),
                          dict(self._dropped))

    async def _set(self, rule: _Rule, directions: tuple[str, ...]) -> None:
        for direction in directions:
            self._rules[direction] = rule
            if rule.mode == "cut":
                for conn in list(self._connections):
                    self._cut(conn, direction)

    async def _reset(self) -> None:
        for conn in list(self._connections):
            self._abort(conn)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        connections = list(self._connections)
        await self._reset()
        tasks = [conn.handler for conn in connections]
        if tasks:
            await asyncio.wait(tasks, timeout=self.timeout / 2)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._accepted += 1
        conn = _Connection((reader, writer), asyncio.current_task())
        self._connections.add(conn)
        try:
            if self._rules[C2S].mode != "blackhole":
                try:
                    async with asyncio.timeout(self.connect_timeout):
                        conn.readers[S2C], conn.writers[C2S] = await asyncio.open_connection(*self.target)
                except (OSError, TimeoutError):
                    return
            for direction in (C2S, S2C):
                if self._rules[direction].mode == "cut":
                    self._cut(conn, direction)
            conn.tasks = [asyncio.ensure_future(self._pump(conn, direction)) for direction in (C2S, S2C)]
            if not conn.blackholed:
                conn.tasks += [asyncio.ensure_future(self._send(conn, direction)) for direction in (C2S, S2C)]
            await asyncio.wait(conn.tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            self._connections.discard(conn)
            self._abort(conn) if conn.failed() else self._close(conn)

    async def _pump(self, conn: _Connection, direction: str) -> None:
        """Read one direction's bytes and queue (or swallow) them according to the direction's rule."""
        reader = conn.readers[direction]
        if reader is None:
            return  # a blackholed connection has no target to read from
        loop = asyncio.get_running_loop()
        while True:
            try:
                data = await reader.read(65536)
            except OSError:
                data = b""
            if not data:
                conn.queues[direction].put_nowait(_EOF)
                return
            self._received[direction] += len(data)
            rule = self._rules[direction]
            if conn.blackholed or direction in conn.cut or rule.mode in ("drop", "cut", "blackhole"):
                self._dropped[direction] += len(data)
                continue
            conn.queues[direction].put_nowait((loop.time() + rule.seconds, data))

    async def _send(self, conn: _Connection, direction: str) -> None:
        """Write one direction's queued chunks when their time comes; end-of-file half-closes the direction."""
        loop = asyncio.get_running_loop()
        writer = conn.writers[direction]
        while True:
            item = await conn.queues[direction].get()
            if item is _EOF:
                self._half_close(conn, direction)
                return
            due, data = item
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            if direction in conn.cut:
                self._dropped[direction] += len(data)
                continue
            writer.write(data)
            async with asyncio.timeout(self.write_timeout):  # not wait_for: in 3.11 it can swallow a cancel
                await writer.drain()
            self._forwarded[direction] += len(data)

    def _cut(self, conn: _Connection, direction: str) -> None:
        queue = conn.queues[direction]
        while not queue.empty():
            item = queue.get_nowait()
            if item is not _EOF:
                self._dropped[direction] += len(item[1])
        self._half_close(conn, direction)

    @staticmethod
    def _half_close(conn: _Connection, direction: str) -> None:
        if direction in conn.cut:
            return
        conn.cut.add(direction)
        writer = conn.writers[direction]
        if writer is not None:
            with contextlib.suppress(OSError, RuntimeError):
                writer.write_eof()

    @staticmethod
    def _close(conn: _Connection) -> None:
        for writer in conn.transports():
            writer.close()
        for task in conn.tasks:
            task.cancel()

    @staticmethod
    def _abort(conn: _Connection) -> None:
        conn.aborted = True
        for writer in conn.transports():
            sock = writer.get_extra_info("socket")
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends RST
            writer.transport.abort()
        for task in conn.tasks:
            task.cancel()
