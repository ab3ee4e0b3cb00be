"""The demo's HTTP endpoint: appends every event it receives to a JSON-lines file.

Run as ``python -m demo.receiver PORT FILE``; a person follows the file with ``tail -f``
and the demo reads it to show arrivals.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from aiohttp import web


def main() -> None:
    port, out = int(sys.argv[1]), Path(sys.argv[2])
    sink = out.open("a", buffering=1)

    async def on_post(request: web.Request) -> web.Response:
        at = time.time()
        try:
            records = (await request.json()).get("Records", [])
        except (ValueError, AttributeError):
            return web.Response(status=400, text="expected {'Records': [...]}")
        for record in records:
            sink.write(json.dumps({"received_at": at, "record": record}) + "\n")
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/{tail:.*}", on_post)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


if __name__ == "__main__":
    main()
