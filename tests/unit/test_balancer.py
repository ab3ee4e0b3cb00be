"""The balancer that plays a Service in front of delivery replicas: round robin per
connection, a backend that refuses connections skipped."""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from devstack.programs import free_port
from devstack.servers.tcpproxy import Balancer


def _backend(name: str) -> ThreadingHTTPServer:
    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = name.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _ask(port: int) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/")
        return connection.getresponse().read().decode()
    finally:
        connection.close()


def test_connections_go_round_robin_and_skip_a_backend_that_refuses() -> None:
    a, b = _backend("a"), _backend("b")
    refusing = free_port()
    try:
        ports = [a.server_address[1], refusing, b.server_address[1]]
        with Balancer(ports) as balancer:
            answers = [_ask(balancer.port) for _ in range(4)]
            assert answers == ["a", "b", "a", "b"]
            assert balancer.connections() == [2, 0, 2]
    finally:
        a.shutdown()
        b.shutdown()
