"""A relay that does nothing but forward: the floor of any hop in the S3 request's path.

Hand-off ``sync`` with direct delivery puts one HTTP hop between the gateway and the
endpoint: the gateway's push reaches our ingest, which pushes to the endpoint and answers
once it has. This relay makes the same hop with the same stack as our ingest (aiohttp
server and client, uvloop, one process, connections kept alive) and no work at all: no
parsing, no identity, no records, no metrics, no durability. Its scenario's throughput is
the most any replica of ours could reach on this machine while it answers the gateway
only after the endpoint: what the hop itself costs in the benchmark's closed loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing.connection
import socket

import aiohttp
import uvloop
from aiohttp import web

from devstack.servers.process import ServerProcess

__all__ = ["Relay"]


async def _serve(conn: multiprocessing.connection.Connection, target: str) -> None:
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))

    async def on_post(request: web.Request) -> web.Response:
        body = await request.read()
        async with session.post(
            target, data=body, headers={"Content-Type": "application/json"}
        ) as answer:
            await answer.read()
            return web.Response(status=answer.status)

    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_post("/{tail:.*}", on_post)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.create_server(("127.0.0.1", 0), backlog=1024)
    await web.SockSite(runner, sock).start()
    conn.send(sock.getsockname()[1])
    await asyncio.Event().wait()


def _main(conn: multiprocessing.connection.Connection, target: str) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(_serve(conn, target))


class Relay(ServerProcess):
    """The relay process; ``url`` forwards each POST to ``target`` and answers with its
    status once ``target`` has answered."""

    def __init__(self, target: str) -> None:
        super().__init__(_main, (target,), "bench-relay")
