"""Letting the gateway's kept-alive connections go before a stopping replica's listener
closes.

The gateway keeps its connections to the ingest alive between pushes (Ceph 20.2 reuses
them), and a Service only routes *new* connections away from a terminating pod. A push sent
on such a connection as the listener closes fails, and with hand-off ``sync`` the gateway
counts it done: an event lost in a rolling update (seen once in about 220 uploads). So once
told to stop, every answer says ``Connection: close`` (the gateway opens its next
connection through the Service, to a live replica), and the listener stays open while
requests still come, up to a bound.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

__all__ = ["ConnectionDrain"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ConnectionDrain:
    def __init__(self) -> None:
        self.closing = False
        """Set when the replica is told to stop: answers close their connection."""
        self._last_request = -1e9

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self._last_request = time.monotonic()
        response = await handler(request)
        if self.closing:
            response.force_close()
        return response

    async def drain(self, server: web.Server, *, max_s: float, quiet_s: float) -> None:
        """Wait until ``server`` has no connection left, or none of them brought a request
        for ``quiet_s`` (an idle one: closing it races only a push sent that instant), or
        ``max_s`` passed."""
        self.closing = True
        deadline = time.monotonic() + max_s
        while server.connections:
            now = time.monotonic()
            until = min(deadline, self._last_request + quiet_s)
            if now >= until:
                return
            await asyncio.sleep(min(until - now, 0.05))
