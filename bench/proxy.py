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


class RoundRobinProxy:
    """Listens on 127.0.0.1:``port`` and spreads connections over ``backends`` (ports)."""

    def __init__(self, backends: list[int]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.backends = backends
        self._counts = [ctx.Value("q", 0) for _ in backends]
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(
            target=_main, args=(child, backends, self._counts), name="bench-proxy", daemon=True
        )
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def connections(self) -> list[int]:
        """Connections forwarded to each backend so far."""
        return [c.value for c in self._counts]

    def __enter__(self) -> RoundRobinProxy:
        self._process.start()
        if not self._conn.poll(60):
            self._process.kill()
            raise RuntimeError("the round-robin proxy did not start within 60 s")
        self.port = int(self._conn.recv())
        return self

    def __exit__(self, *exc: object) -> None:
        self._process.terminate()
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
