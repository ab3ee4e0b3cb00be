"""A TCP forwarder on the test's event loop: a network outage a test controls, without
touching the shared broker behind it."""

from __future__ import annotations

import asyncio
import contextlib

from devstack.programs import free_port


class AsyncTcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._transports: set[asyncio.WriteTransport] = set()
        self.accepted = 0
        """Client connections accepted so far (across restarts)."""

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, "127.0.0.1", self.port, reuse_address=True
        )

    async def stop(self) -> None:
        """Stop listening and cut every connection, as a broker that goes away does."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for transport in list(self._transports):
            transport.abort()
        self._transports.clear()
        await asyncio.sleep(0)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._transports |= {writer.transport, up_writer.transport}
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except OSError:
            pass
        finally:
            self._transports.discard(dst.transport)
            with contextlib.suppress(Exception):
                dst.transport.abort()
