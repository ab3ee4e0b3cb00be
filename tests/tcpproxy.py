"""TCP forwarders on threads: one a test can take down and bring back (a real network
outage), and a round-robin balancer over several ports (a Service's part). Threads, so that
synchronous and asyncio tests use the same ones.

``TcpProxy`` makes the real gateway unreachable for the operator without stopping the
gateway for every other test; ``Balancer`` spreads connections over delivery replicas.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from collections.abc import Callable

from devstack.programs import free_port


def _pipe(
    src: socket.socket, dst: socket.socket, seen: Callable[[bytes], None] | None = None
) -> None:
    """Copy ``src`` to ``dst`` until either side ends, then shut both down; ``seen`` gets
    what is copied."""
    try:
        while data := src.recv(65536):
            if seen is not None:
                seen(data)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _forward(
    a: socket.socket, b: socket.socket, seen: Callable[[bytes], None] | None = None
) -> None:
    """Both directions; ``seen`` gets what ``a`` sends."""
    threading.Thread(target=_pipe, args=(a, b, seen), daemon=True).start()
    threading.Thread(target=_pipe, args=(b, a), daemon=True).start()


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1") -> None:
        """``listen_host``: another local address, such as the test cluster's bridge, for
        clients in pods, which cannot reach the host's loopback."""
        self._target = (target_host, target_port)
        self.host = listen_host
        self.port = free_port(listen_host)
        self._server: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._sent: list[bytes] = []
        self._sent_lock = threading.Lock()
        self.accepted = 0
        """Client connections accepted so far (across restarts)."""

    def sent(self) -> bytes:
        """Every byte the clients sent through the proxy so far, connection after
        connection (an HTTP client's requests can be counted by their request lines)."""
        with self._sent_lock:
            return b"".join(self._sent)

    def _seen(self, data: bytes) -> None:
        with self._sent_lock:
            self._sent.append(data)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def point_at(self, target_host: str, target_port: int) -> None:
        """Forward the connections accepted from now on elsewhere (a server replaced)."""
        self._target = (target_host, target_port)

    def start(self) -> None:
        server = socket.create_server((self.host, self.port), reuse_port=True)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def stop(self) -> None:
        """Stop listening and cut every connection, as a server that goes away does."""
        if self._server is not None:
            # close() alone leaves a thread blocked in accept() listening; shutdown wakes it.
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None
        for conn in self._conns:
            conn.close()
        self._conns.clear()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            self.accepted += 1
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            self._conns += [client, upstream]
            _forward(client, upstream, self._seen)


class Balancer:
    """Round-robin TCP forwarding to ``ports``, skipping those that refuse connections: a
    killed replica drops out as its endpoint would."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self._next = itertools.cycle(range(len(ports)))
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        for _ in self.ports:
            port = self.ports[next(self._next)]
            try:
                upstream = socket.create_connection(("127.0.0.1", port), timeout=2)
            except OSError:
                continue
            upstream.settimeout(None)
            _forward(client, upstream)
            return
        client.close()
