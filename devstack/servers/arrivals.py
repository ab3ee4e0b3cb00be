"""An HTTP endpoint that notes when each event arrived: the benchmarks' and the demo's.

It takes POSTs of ``{"Records": [...]}`` on any path and stamps each record with the
wall-clock time its request arrived (the senders run on the same machine, so arrival minus
``eventTime`` is the delivery latency). Two ways to read what arrived:

- in memory, fetched with ``GET /_arrivals?from=<n>``: ``Receiver`` runs the endpoint in a
  process of its own for the benchmarks, because their PUT threads hold the GIL often
  enough to delay a server thread beside them, and that delay would be counted as latency;
- a JSON-lines journal, one ``{"received_at": ..., "record": {...}}`` per event, that a
  person follows with ``tail -f``: ``python -m devstack.servers.arrivals --port P
  --journal FILE`` (the demo's endpoint).

A body that is not JSON is answered 400 and counted (``malformed``), never recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import multiprocessing.connection
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, NamedTuple, Self

from aiohttp import web

from devstack.servers.process import ServerProcess

__all__ = ["Arrival", "Receiver", "arrivals_app", "main"]

_FETCH_PATH = "/_arrivals"


class Arrival(NamedTuple):
    key: str
    etag: str
    event: str
    at: float
    """time.time() when the request carrying the record arrived."""


def records_of(body: bytes) -> list[dict[str, Any]]:
    """The records of a notification body; raises ``ValueError`` if it is not JSON."""
    doc = json.loads(body)
    if isinstance(doc, dict) and isinstance(doc.get("Records"), list):
        return [r for r in doc["Records"] if isinstance(r, dict)]
    # A bare record: not what the gateway or our endpoints send, but counted rather than lost.
    return [doc] if isinstance(doc, dict) else []


class _Memory:
    """Arrivals kept for ``GET /_arrivals``."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, float]] = []

    def __call__(self, record: dict[str, Any], at: float) -> None:
        obj = (record.get("s3") or {}).get("object") or {}
        self.rows.append(
            (str(obj.get("key", "")), str(obj.get("eTag", "")), str(record.get("eventName")), at)
        )


class _Journal:
    """Arrivals appended to a JSON-lines file, a line at a time so ``tail -f`` shows each."""

    def __init__(self, path: Path) -> None:
        self._file: IO[str] = path.open("a", buffering=1)

    def __call__(self, record: dict[str, Any], at: float) -> None:
        self._file.write(json.dumps({"received_at": at, "record": record}) + "\n")


def arrivals_app(*, delay_s: float = 0.0, journal: Path | None = None) -> web.Application:
    """The endpoint as an aiohttp application: answers 200 ``delay_s`` after each request
    arrived (a slow endpoint; the arrival is what counts)."""
    note: Callable[[dict[str, Any], float], None]
    memory = _Memory()
    note = _Journal(journal) if journal is not None else memory
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
            records = records_of(body)
        except ValueError:
            malformed += 1
            return web.Response(status=400, text="expected a JSON body {'Records': [...]}")
        for record in records:
            note(record, at)
        if delay_s:
            await asyncio.sleep(delay_s)
        return web.Response(status=200)

    async def on_fetch(request: web.Request) -> web.Response:
        start = int(request.query.get("from", "0"))
        return web.json_response({"records": memory.rows[start:], "malformed": malformed})

    app = web.Application(client_max_size=16 * 1024 * 1024)
    if journal is None:
        app.router.add_get(_FETCH_PATH, on_fetch)
    app.router.add_post("/{tail:.*}", on_post)
    return app


async def _serve(
    app: web.Application, port: int, started: Callable[[int], None] | None = None
) -> None:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    # A replica opens up to 64 push connections at once: a short backlog would drop SYNs
    # and delay pushes by a retransmission, counted as latency.
    sock = socket.create_server(("127.0.0.1", port), backlog=1024)
    await web.SockSite(runner, sock).start()
    if started is not None:
        started(sock.getsockname()[1])
    await asyncio.Event().wait()  # until the process is ended


def _child(conn: multiprocessing.connection.Connection, delay_s: float) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(arrivals_app(delay_s=delay_s), 0, conn.send))


class Receiver(ServerProcess):
    """The endpoint in a process of its own on a free loopback port (``url``), arrivals
    kept in memory and read with ``fetch``."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__(_child, (delay_s,), "arrivals-endpoint")
        self._fetched = 0
        self.malformed = 0
        """Requests answered 400 because their body was not JSON."""

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m devstack.servers.arrivals",
        description="An HTTP endpoint on 127.0.0.1 that appends every event it is sent to a "
        "JSON-lines file.",
    )
    parser.add_argument("--port", type=int, required=True, help="the port to listen on")
    parser.add_argument("--journal", type=Path, required=True, help="the JSON-lines file")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(arrivals_app(journal=args.journal), args.port))


if __name__ == "__main__":
    main()
