"""A real HTTP endpoint for notifications: records every POST body it is sent.

This is the endpoint end of a test, not a stand-in for any service under test.
"""

from __future__ import annotations

import json
import queue
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Server(ThreadingHTTPServer):
    # socketserver's listen backlog is 5. A replica opens up to 64 push connections at
    # once; on a loaded machine the overflowing SYNs are dropped and retransmitted after
    # 1, 2, 4 s..., so a push can reach the endpoint (and be recorded) after the replica
    # gave it up and sends it again: a duplicate of the test endpoint's making, not of the
    # delivery under test.
    request_queue_size = 1024


class ReceivedRequest:
    """One request a ``RecordingHttpServer`` answered."""

    def __init__(
        self, path: str, headers: list[tuple[str, str]], body: bytes, port: int, status: int = 200
    ) -> None:
        self.time = time.time()
        """When it was answered."""
        self.status = status
        """What it was answered."""
        self.path = path
        self.headers = headers
        """(name, value) as sent, names lower-cased."""
        self.body = body
        self.client_port = port
        """The client's source port: one per connection, so it shows connection reuse."""

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k == name.lower()]
        return values[0] if values else None


class RecordingHttpServer:
    """An HTTP(S) endpoint on 127.0.0.1 (or ``host``) that records every POST.

    HTTP/1.1 with keep-alive (a client may reuse its connection); answers ``status`` after
    ``delay_s`` (both can be changed while it runs), and with ``hold`` only once that is set,
    and counts the requests it serves at once.
    With ``ssl_context`` it speaks HTTPS; a client that fails the handshake gets nothing.
    """

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        status: int = 200,
        delay_s: float = 0,
        host: str = "127.0.0.1",
        keep_alive: bool = True,
        hold: threading.Event | None = None,
    ) -> None:
        """``keep_alive``: HTTP/1.1 with persistent connections, else HTTP/1.0 (a connection
        per request). ``hold``: a push is answered only once it is set (a test decides when
        a push under way ends, rather than a delay a busy machine may outlast)."""
        self.requests: queue.Queue[ReceivedRequest] = queue.Queue()
        self.status = status
        self.delay_s = delay_s
        self.hold = hold
        self.max_concurrent = 0
        self._concurrent = 0
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

            def do_POST(self) -> None:
                with lock:
                    outer._concurrent += 1
                    outer.max_concurrent = max(outer.max_concurrent, outer._concurrent)
                try:
                    length = int(self.headers.get("Content-Length", "0"))
                    body = self.rfile.read(length)
                    if len(body) < length:
                        return  # the client died mid-request (a killed replica): not received
                    if outer.delay_s:
                        time.sleep(outer.delay_s)
                    if outer.hold is not None:
                        outer.hold.wait()
                    headers = [(k.lower(), v) for k, v in self.headers.items()]
                    status = outer.status
                    outer._received(
                        ReceivedRequest(self.path, headers, body, self.client_address[1], status)
                    )
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                finally:
                    with lock:
                        outer._concurrent -= 1

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = _Server((host, 0), Handler)
        self._server.daemon_threads = True
        if ssl_context is not None:
            self._server.socket = ssl_context.wrap_socket(self._server.socket, server_side=True)
        self._tls = ssl_context is not None
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{'https' if self._tls else 'http'}://{host!s}:{port}"

    def __enter__(self) -> RecordingHttpServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def in_flight(self) -> int:
        """Requests being served right now (received, not yet answered)."""
        return self._concurrent

    def _received(self, request: ReceivedRequest) -> None:
        self.requests.put(request)

    def received(self) -> list[ReceivedRequest]:
        """Every request recorded so far (and not taken before)."""
        taken = []
        while True:
            try:
                taken.append(self.requests.get_nowait())
            except queue.Empty:
                return taken


class HttpReceiver(RecordingHttpServer):
    """An HTTP endpoint on 127.0.0.1 that answers 200 and queues each JSON body it gets
    (``next_records``), a connection per request."""

    def __init__(self) -> None:
        super().__init__(keep_alive=False)
        self.bodies: queue.Queue[Any] = queue.Queue()

    def _received(self, request: ReceivedRequest) -> None:
        super()._received(request)
        self.bodies.put(json.loads(request.body))

    def __enter__(self) -> HttpReceiver:
        super().__enter__()
        return self

    def next_records(self, timeout: float = 20) -> list[dict[str, Any]]:
        body = self.bodies.get(timeout=timeout)
        records: list[dict[str, Any]] = body["Records"]
        return records


def keys_of(requests: list[ReceivedRequest]) -> list[str]:
    """The object key of every record in these requests' ``{"Records": [...]}`` bodies."""
    return [
        record["s3"]["object"]["key"]
        for request in requests
        for record in json.loads(request.body)["Records"]
    ]
