"""A stopping operator leaves its Service's endpoints before it is gone: the whole process,
signalled as the kubelet signals it, against the real apiserver."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.localservices import LocalService
from tests.operator import StartOperator
from tests.processes import free_port
from tests.serviceaccounts import proxied_kubeconfig
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")

RETRY_PERIOD_S = 5
"""The leader's request timeout for its Lease, so at least how long its hand-back of the
Lease waits on an API server that never answers."""

STOPPING = (503, {"ready": False, "reason": "stopping"})


@contextlib.contextmanager
def silent_server() -> Iterator[tuple[str, int]]:
    """A TCP server that takes every connection and never answers, as an API server that
    hangs: a request to it ends only by its client's timeout."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield server.getsockname()[:2]
    finally:
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)
        server.close()
        for conn in held:
            conn.close()


def readiness(port: int) -> tuple[int, object] | None:
    """/readyz's status and body; None once nothing answers (the process has ended)."""
    try:
        answer = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
    except httpx.TransportError:
        return None
    return answer.status_code, answer.json()


def test_a_stopping_operator_answers_503_on_readyz_until_it_exits(
    kube: LocalService, start_operator: StartOperator, tmp_path: Path
) -> None:
    """The operator reaches the API server through a proxy. Once it leads, the test points
    the proxy at a server that never answers: the Lease hand-back that SIGTERM starts then
    waits for its timeout, a stop that lasts, and /readyz must say 503 all through it."""
    proxy = proxied_kubeconfig(kube, tmp_path / "kubeconfig")
    port = free_port()
    proxy.start()
    try:
        with silent_server() as silent:
            operator = start_operator(
                extra_env={"KUBECONFIG": str(tmp_path / "kubeconfig")},
                metrics_port=str(port),
                # Long enough that the leader keeps the Lease, and does not give up leading,
                # while its renewals hang too.
                lease_duration_seconds="60",
                renew_deadline_seconds="45",
                retry_period_seconds=str(RETRY_PERIOD_S),
            )
            wait_until(operator.log, lambda log: "acquired the leader Lease" in log, 30, "leading")
            wait_until(lambda: readiness(port), lambda r: r == (200, {"ready": True}), 30, "ready")

            # The connections in use break; every new one reaches the silent server.
            proxy.point_at(*silent)
            proxy.stop()
            proxy.start()
            signalled = time.monotonic()
            operator.process.send_signal(signal.SIGTERM)

            # The answer first, then the process: a 503 seen while it still runs.
            answer, running = wait_until(
                lambda: (readiness(port), operator.process.poll() is None),
                lambda seen: seen[0] != (200, {"ready": True}) or not seen[1],
                60,
                "/readyz to stop answering 200",
                interval=0.1,
            )
            assert running, f"the operator exited while /readyz said {answer}"
            assert answer == STOPPING
            # Every answer until the process ends says the same.
            while operator.process.poll() is None:
                assert readiness(port) in (STOPPING, None)
                assert time.monotonic() - signalled < 120, "the operator never exited"
                time.sleep(0.2)
            assert operator.process.returncode == 0, operator.tail()
            assert "could not release the leader Lease" in operator.log(), (
                "the hand-back did not wait on the silent server: the test held nothing"
            )
    finally:
        proxy.stop()
