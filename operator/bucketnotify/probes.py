"""The operator's HTTP server: ``GET /healthz``, ``GET /readyz`` and ``GET /metrics``.

It runs on the operator's event loop on purpose: a loop stuck in a blocking call stops
answering ``/healthz`` and the kubelet restarts the pod, where the Prometheus client's own
server, answering from a thread, would go on saying all is well.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

__all__ = ["probes_app", "serve_probes"]


def probes_app(
    exposition: Callable[[], bytes],
    unready: Callable[[], str | None],
    client_max_size: int = 1024**2,
) -> web.Application:
    """``/healthz``: 200 whenever the loop answers; ``/readyz``: 503 with the reason
    ``unready()`` gives, 200 once it gives None; ``/metrics``: ``exposition()``. The
    delivery replica adds its ingest routes to it."""
    app = web.Application(client_max_size=client_max_size)

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"alive": True})

    async def readyz(request: web.Request) -> web.Response:
        reason = unready()
        if reason is not None:
            return web.json_response({"ready": False, "reason": reason}, status=503)
        return web.json_response({"ready": True})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def serve_probes(
    port: int, exposition: Callable[[], bytes], unready: Callable[[], str | None]
) -> web.AppRunner:
    """Serve :func:`probes_app` on every address at ``port``; clean up the runner to stop."""
    runner = web.AppRunner(probes_app(exposition, unready), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, None, port).start()
    return runner
