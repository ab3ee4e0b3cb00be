"""A stopping replica tells the gateway to close its kept-alive connections."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bucketnotify.delivery.ingest.draining import ConnectionDrain


async def test_once_stopping_every_answer_closes_its_connection_and_the_drain_ends() -> None:
    drain = ConnectionDrain()

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(middlewares=[drain.middleware])
    app.router.add_post("/", ok)
    async with TestClient(TestServer(app)) as client:
        before = await client.post("/")
        assert before.status == 200 and before.headers.get("Connection", "") != "close"
        drain.closing = True
        after = await client.post("/")
        assert after.status == 200 and after.headers["Connection"] == "close"
        server = client.server.runner.server
        assert server is not None
        # No request for the quiet time: the drain ends without waiting for its bound. That
        # bound is an hour here, so that ending at all is the proof, on however busy a
        # machine; the minute is only how long the test waits for it.
        await asyncio.wait_for(drain.drain(server, max_s=3600, quiet_s=0.2), 60)
