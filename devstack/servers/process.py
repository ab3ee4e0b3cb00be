"""A server in a process of its own: the benchmarks' endpoint and relay, and the balancer
in front of delivery replicas (tests and benchmarks).

A process of its own because the benchmark's PUT threads, and a test's stream writers and
endpoints, hold the GIL often enough to delay a server thread beside them, and that delay
would be counted in the figures, or in a test's timing. The child listens on a free
loopback port and sends it over a pipe once it accepts connections.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
from collections.abc import Callable
from typing import Any, Self

__all__ = ["ServerProcess"]


class ServerProcess:
    """Runs ``target(conn, *args)`` in a spawned process; ``target`` sends its port on
    ``conn`` once listening. ``start`` and ``close``, or a context manager."""

    def __init__(self, target: Callable[..., None], args: tuple[Any, ...], name: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=target, args=(child, *args), name=name, daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def start(self) -> Self:
        self._process.start()
        if not self._conn.poll(60):
            self._process.kill()
            raise RuntimeError(f"{self._process.name} did not start within 60 s")
        self.port = int(self._conn.recv())
        return self

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._process.pid is None:
            return  # never started
        self._process.terminate()
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
