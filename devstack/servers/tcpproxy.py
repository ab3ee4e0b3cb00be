"""TCP forwarders: one a test can take down and bring back (a real network outage), and a
round-robin balancer over several ports (a Service's part), for tests and benchmarks.

``TcpProxy`` (threads, so that synchronous and asyncio tests use the same one) makes the
real gateway unreachable for the operator without stopping the gateway for every other
test; ``Balancer`` (a process of its own) spreads connections over delivery replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import multiprocessing.connection
import socket
import threading
from collections.abc import Callable
from multiprocessing.sharedctypes import Synchronized

from devstack.programs import free_port
from devstack.servers.process import ServerProcess


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


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(Exception):
            dst.close()


async def _balance(
    conn: multiprocessing.connection.Connection,
    backends: list[int],
    counts: list[Synchronized[int]],
) -> None:
    turn = itertools.cycle(range(len(backends)))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in backends:
            index = next(turn)
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", backends[index])
            except OSError:
                continue
            up_sock = up_writer.get_extra_info("socket")
            if up_sock is not None:
                up_sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with counts[index].get_lock():
                counts[index].value += 1
            await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
            return
        writer.close()

    sock = socket.create_server(("127.0.0.1", 0), backlog=1024)
    server = await asyncio.start_server(handle, sock=sock)
    conn.send(sock.getsockname()[1])
    async with server:
        await server.serve_forever()


def _balancer_main(
    conn: multiprocessing.connection.Connection,
    backends: list[int],
    counts: list[Synchronized[int]],
) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_balance(conn, backends, counts))


class Balancer(ServerProcess):
    """Round-robin TCP forwarding to ``backends`` (ports), skipping those that refuse the
    connection: a killed replica drops out as its endpoint would. Balance is per connection,
    as with a Kubernetes Service (kube-proxy), so a client that keeps one connection alive
    talks to one replica: ``connections`` shows how they were spread. In a process of its
    own, so that forwarding never waits for the threads of the test or benchmark beside it;
    ``start`` (or ``with``) before use."""

    def __init__(self, backends: list[int]) -> None:
        self.backends = backends
        self._counts = [multiprocessing.get_context("spawn").Value("q", 0) for _ in backends]
        super().__init__(_balancer_main, (backends, self._counts), "balancer")

    def connections(self) -> list[int]:
        """Connections forwarded to each backend so far."""
        return [c.value for c in self._counts]
