"""The benchmark's HTTP endpoint: an aiohttp server in a process of its own.

A process of its own because the benchmark's 8 PUT threads hold the GIL often enough to
delay a server thread beside them, and that delay would be counted as delivery latency.
Each record is stored with the wall-clock time its request arrived (the sender's clock is
the same machine's); the benchmark fetches them with ``GET /_bench/received?from=<n>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import multiprocessing
import multiprocessing.connection
import socket
import time
from typing import Any, NamedTuple, Self

from aiohttp import web
from tests.serverprocess import ServerProcess

__all__ = ["Arrival", "Receiver"]

_FETCH_PATH = "/_bench/received"


class Arrival(NamedTuple):
    key: str
    etag: str
    event: str
    at: float
    """time.time() when the request carrying the record arrived."""


def _records(body: bytes) -> list[dict[str, Any]]:
    doc = json.loads(body)
    if isinstance(doc, dict) and isinstance(doc.get("Records"), list):
        return [r for r in doc["Records"] if isinstance(r, dict)]
    # A bare record: not what the gateway or our endpoint send, but counted rather than lost.
    return [doc] if isinstance(doc, dict) else []


async def _serve(conn: multiprocessing.connection.Connection, delay_s: float) -> None:
    received: list[tuple[str, str, str, float]] = []
    malformed = 0

    async def on_post(request: web.Request) -> web.Response:
        nonlocal malformed
        at = time.time()
        try:
            body = await request.read()
        except ConnectionResetError:
            # The sender died mid-request (the failover benchmark kills it): it never got
            # an answer, so the events stay queued and are counted when they come again.
            return web.Response(status=500)
        try:
            records = _records(body)
        except ValueError:
            malformed += 1
            return web.Response(status=200)
        for record in records:
            obj = (record.get("s3") or {}).get("object") or {}
            received.append(
                (
                    str(obj.get("key", "")),
                    str(obj.get("eTag", "")),
                    str(record.get("eventName")),
                    at,
                )
            )
        if delay_s:
            await asyncio.sleep(delay_s)
        return web.Response(status=200)

    async def on_fetch(request: web.Request) -> web.Response:
        start = int(request.query.get("from", "0"))
        return web.json_response({"records": received[start:], "malformed": malformed})

    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_get(_FETCH_PATH, on_fetch)
    app.router.add_post("/{tail:.*}", on_post)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.create_server(("127.0.0.1", 0), backlog=1024)
    await web.SockSite(runner, sock).start()
    conn.send(sock.getsockname()[1])
    # The parent ends this process; until then serve.
    await asyncio.Event().wait()


def _main(conn: multiprocessing.connection.Connection, delay_s: float) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(conn, delay_s))


class Receiver(ServerProcess):
    """The endpoint process; ``url`` takes POSTs of ``{"Records": [...]}`` on any path and
    answers ``delay_s`` after each arrived (a slow endpoint; the arrival is what counts)."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__(_main, (delay_s,), "bench-receiver")
        self._fetched = 0
        self.malformed = 0

    def __enter__(self) -> Self:
        super().__enter__()
        self._http = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()
        super().__exit__(*exc)

    def fetch(self) -> list[Arrival]:
        """The records that arrived since the previous fetch."""
        self._http.request("GET", f"{_FETCH_PATH}?from={self._fetched}")
        answer = json.loads(self._http.getresponse().read())
        self.malformed = int(answer["malformed"])
        got = [Arrival(*row) for row in answer["records"]]
        self._fetched += len(got)
        return got
