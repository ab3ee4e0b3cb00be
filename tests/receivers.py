"""A real HTTP endpoint for notifications: records every POST body it is sent.

This is the endpoint end of a test, not a stand-in for any service under test.
"""

from __future__ import annotations

import json
import queue
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class HttpReceiver:
    """An HTTP server on 127.0.0.1 that answers 200 and queues each JSON body it gets."""

    def __init__(self) -> None:
        self.bodies: queue.Queue[Any] = queue.Queue()
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                received.put(json.loads(raw))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> HttpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def next_records(self, timeout: float = 20) -> list[dict[str, Any]]:
        body = self.bodies.get(timeout=timeout)
        records: list[dict[str, Any]] = body["Records"]
        return records
