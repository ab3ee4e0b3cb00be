"""A round-robin TCP proxy: several delivery replicas behind one ingest URL, as a Service.

Each new connection goes to the next backend; a backend that refuses the connection is
skipped for that connection. It runs in a process of its own so that forwarding never waits
for the benchmark's PUT threads. Balance is per connection, as with a Kubernetes Service
(kube-proxy), so a client that keeps one connection alive talks to one replica:
``connections`` shows how the gateway's connections were spread.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import multiprocessing.connection
import socket
from multiprocessing.sharedctypes import Synchronized

from bench.child import ServerProcess

__all__ = ["RoundRobinProxy"]


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(Exception):
            dst.close()


async def _serve(
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
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            return
        writer.close()

    sock = socket.create_server(("127.0.0.1", 0), backlog=1024)
    server = await asyncio.start_server(handle, sock=sock)
    conn.send(sock.getsockname()[1])
    async with server:
        await server.serve_forever()


def _main(
    conn: multiprocessing.connection.Connection,
    backends: list[int],
    counts: list[Synchronized[int]],
) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(conn, backends, counts))


class RoundRobinProxy(ServerProcess):
    """Listens on 127.0.0.1:``port`` and spreads connections over ``backends`` (ports)."""

    def __init__(self, backends: list[int]) -> None:
        self.backends = backends
        self._counts = [multiprocessing.get_context("spawn").Value("q", 0) for _ in backends]
        super().__init__(_main, (backends, self._counts), "bench-proxy")

    def connections(self) -> list[int]:
        """Connections forwarded to each backend so far."""
        return [c.value for c in self._counts]
