"""A TCP forwarder that a test can take down and bring back: a real network outage.

Used to make the real gateway unreachable for the operator without stopping the gateway
for every other test.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1") -> None:
        """``listen_host``: another local address, such as the test cluster's bridge, for
        clients in pods, which cannot reach the host's loopback."""
        self._target = (target_host, target_port)
        self.host = listen_host
        probe = socket.socket()
        probe.bind((listen_host, 0))
        self.port: int = probe.getsockname()[1]
        probe.close()
        self._server: socket.socket | None = None
        self._conns: list[socket.socket] = []

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def point_at(self, target_host: str, target_port: int) -> None:
        """Forward the connections accepted from now on elsewhere (a server replaced)."""
        self._target = (target_host, target_port)

    def start(self) -> None:
        server = socket.create_server((self.host, self.port), reuse_port=True)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            # close() alone leaves a thread blocked in accept() listening; shutdown wakes it.
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None
        for conn in self._conns:
            conn.close()
        self._conns.clear()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
