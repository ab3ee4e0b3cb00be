"""httpcore's network backend, with an idle connection's liveness check made cheap.

Before every request httpcore's pool asks each idle connection whether its socket is
readable (a server that closed a kept-alive connection leaves it readable at EOF), and the
anyio stream answers that by building its whole attribute map, a ``getpeername`` system
call included: with a pool of many idle connections that was about 40 % of a delivery
replica's event-loop time. The streams here keep their socket and answer with one poll,
and repeat a "still open" answer for ``RECHECK_S`` instead of polling again: the pool asks
every idle connection twice per request, so under load each one was polled thousands of
times a second. A server that closes a connection in that window makes one push fail
(retryable, retried as any failed push); that race exists without the window as well,
between the poll and the request's first write, only narrower.
"""

# The ``timeout`` parameters are httpcore's interface, not ours to replace.
# ruff: noqa: ASYNC109

from __future__ import annotations

import select
import socket
import ssl
import time
import typing

import httpcore

__all__ = ["RECHECK_S", "ReadableCheckBackend"]

RECHECK_S = 0.02


class _Stream(httpcore.AsyncNetworkStream):
    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream = stream
        self._socket: socket.socket | None = stream.get_extra_info("socket")
        self._open_at = -RECHECK_S
        """When a poll last found the socket open (monotonic seconds)."""

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._stream.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._stream.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        # TLS runs over the same socket: its readability means the same.
        return _Stream(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> typing.Any:
        if info == "is_readable":
            now = time.monotonic()
            if now - self._open_at < RECHECK_S:
                return False
            readable = _readable(self._socket)
            if not readable:
                self._open_at = now
            return readable
        return self._stream.get_extra_info(info)


def _readable(sock: socket.socket | None) -> bool:
    """As httpcore's own check: a socket gone, or one with data (or EOF) waiting."""
    fd = -1 if sock is None else sock.fileno()
    if fd < 0:
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


class ReadableCheckBackend(httpcore.AsyncNetworkBackend):
    """httpcore's default (anyio) backend, its streams wrapped in ``_Stream``."""

    def __init__(self) -> None:
        self._backend = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._backend.connect_tcp(
            host, port, timeout, local_address=local_address, socket_options=socket_options
        )
        return _Stream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._backend.connect_unix_socket(
            path, timeout, socket_options=socket_options
        )
        return _Stream(stream)

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)
