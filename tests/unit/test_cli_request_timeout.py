"""``--request-timeout`` of the admin CLI: how long it waits for an API server that took the
connection and never answers (a stuck or overloaded one) before it gives up, exit code 3.

The server here is a listening socket that never answers, which no Kubernetes API server
can be made to do on purpose; nothing of the API is imitated."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.processes import run_cli


@pytest.fixture()
def silent_server() -> Iterator[str]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)  # the kernel completes the handshakes; nobody reads or answers
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def kubeconfig(tmp_path: Path, server: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return str(path)


async def test_a_request_the_api_server_never_answers_is_given_up_after_the_timeout(
    silent_server: str, tmp_path: Path
) -> None:
    """One second: given up long before the default 30 s would be; three seconds: not before
    three (a busy machine makes it later, never earlier)."""
    env = {"KUBECONFIG": kubeconfig(tmp_path, silent_server)}
    took = {}
    for seconds in ("1", "3"):
        started = time.monotonic()
        result = await run_cli(env, "topic", "list", "-n", "ns", "--request-timeout", seconds)
        took[seconds] = time.monotonic() - started
        assert result.code == 3, result
        assert result.err == (
            f"error: cannot reach the API server at {silent_server}: no answer within"
            f" {seconds} s (--request-timeout)\n"
        )
    assert took["1"] < 15, took
    assert took["3"] >= 3, took
