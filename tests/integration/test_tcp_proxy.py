"""connector/soak/proxy.py against a plain echo server on loopback: every mode, reset and close."""
import socket
import socketserver
import threading
import time

import pytest

from connector.soak.proxy import C2S, S2C, TcpProxy
from tests.harness.poll import poll_until


class EchoServer(socketserver.ThreadingTCPServer):
    """Echoes every byte back; counts connections and the ones whose client half-closed (EOF seen)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        self.connections = 0
        self.eofs = 0
        super().__init__(("127.0.0.1", 0), EchoHandler)


class EchoHandler(socketserver.BaseRequestHandler):
    def handle(self):
        self.server.connections += 1
        self.request.settimeout(30)
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except OSError:
            return
        self.server.eofs += 1


@pytest.fixture
def echo():
    server = EchoServer()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(10)


@pytest.fixture
def proxy(echo):
    with TcpProxy(*echo.server_address) as p:
        yield p


def connect(proxy: TcpProxy, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection((proxy.host, proxy.port), timeout=timeout)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def test_pass_forwards_both_ways(proxy, echo):
    with connect(proxy) as sock:
        sock.sendall(b"hello")
        assert recv_exactly(sock, 5) == b"hello"
    poll_until(lambda: proxy.stats().forwarded == {C2S: 5, S2C: 5}, 10, what="the counters to catch up")
    stats = proxy.stats()
    assert stats.accepted == 1 and echo.connections == 1 and stats.dropped == {C2S: 0, S2C: 0}


def test_delay_holds_every_chunk_for_the_given_time(proxy):
    proxy.set_mode("delay", direction=C2S, seconds=0.4)
    with connect(proxy) as sock:
        started = time.monotonic()
        sock.sendall(b"slow")
        assert recv_exactly(sock, 4) == b"slow"
        assert time.monotonic() - started >= 0.4
        proxy.set_mode("pass")
        sock.sendall(b"fast")
        assert recv_exactly(sock, 4) == b"fast"


def test_drop_of_replies_swallows_them_and_keeps_the_connection(proxy, echo):
    proxy.set_mode("drop", direction=S2C)
    with connect(proxy, timeout=0.5) as sock:
        sock.sendall(b"lost reply")
        with pytest.raises(socket.timeout):
            sock.recv(100)
        poll_until(lambda: proxy.stats().dropped[S2C] == 10, 10, what="the echo to be swallowed")
        assert proxy.stats().forwarded[C2S] == 10  # the request arrived
        proxy.set_mode("pass")
        sock.sendall(b"again")
        assert recv_exactly(sock, 5) == b"again"


def test_drop_of_requests_never_reaches_the_server(proxy, echo):
    proxy.set_mode("drop", direction=C2S)
    with connect(proxy, timeout=0.5) as sock:
        sock.sendall(b"lost request")
        poll_until(lambda: proxy.stats().dropped[C2S] == 12, 10, what="the request to be swallowed")
        with pytest.raises(socket.timeout):
            sock.recv(100)
    assert proxy.stats().forwarded[C2S] == 0


def test_blackhole_accepts_and_never_answers_nor_connects(proxy, echo):
    proxy.set_mode("blackhole")
    with connect(proxy, timeout=0.5) as sock:
        sock.sendall(b"anyone?")
        with pytest.raises(socket.timeout):
            sock.recv(100)
    assert echo.connections == 0
    proxy.set_mode("pass")
    with connect(proxy) as sock:
        sock.sendall(b"back")
        assert recv_exactly(sock, 4) == b"back"
    assert echo.connections == 1


def test_cut_server_to_client_gives_the_client_end_of_file(proxy):
    with connect(proxy) as sock:
        sock.sendall(b"one")
        assert recv_exactly(sock, 3) == b"one"
        proxy.set_mode("cut", direction=S2C)
        assert sock.recv(100) == b""
        sock.sendall(b"still goes")  # the other direction still carries bytes
        poll_until(lambda: proxy.stats().forwarded[C2S] == 13, 10, what="the request to pass the cut")


def test_cut_client_to_server_gives_the_server_end_of_file(proxy, echo):
    with connect(proxy) as sock:
        sock.sendall(b"one")
        assert recv_exactly(sock, 3) == b"one"
        proxy.set_mode("cut", direction=C2S)
        poll_until(lambda: echo.eofs == 1, 10, what="the server to see end-of-file")
        assert sock.recv(100) == b""  # the echo server closed in turn
    proxy.set_mode("pass")
    with connect(proxy) as sock:
        sock.sendall(b"new")
        assert recv_exactly(sock, 3) == b"new"


def test_reset_closes_current_connections_abruptly_and_new_ones_pass(proxy):
    with connect(proxy) as old:
        old.sendall(b"x")
        assert recv_exactly(old, 1) == b"x"
        proxy.reset()
        with pytest.raises(ConnectionResetError):
            old.recv(100)
    poll_until(lambda: proxy.stats().open == 0, 10, what="the reset connection to be gone")
    with connect(proxy) as new:
        new.sendall(b"y")
        assert recv_exactly(new, 1) == b"y"


def test_close_stops_listening(echo):
    with TcpProxy(*echo.server_address) as proxy:
        address = (proxy.host, proxy.port)
        with connect(proxy) as sock:
            sock.sendall(b"z")
            assert recv_exactly(sock, 1) == b"z"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=2).close()


def test_bad_modes_are_refused(proxy):
    with pytest.raises(ValueError, match="allowed modes are"):
        proxy.set_mode("slow")
    with pytest.raises(ValueError, match="allowed directions"):
        proxy.set_mode("drop", direction="up")
    with pytest.raises(ValueError, match="seconds > 0"):
        proxy.set_mode("delay")
