"""Our own programs for tests: devstack.programs, and the admin CLI run once to its end."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Any

from devstack.programs import BIN, Program, free_port

__all__ = ["BIN", "Program", "Result", "base_env", "free_port", "run_cli"]


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def base_env() -> dict[str, str]:
    # The caller's own settings must not leak into what a test asserts.
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("BUCKETNOTIFY_") and k != "KUBECONFIG"
    }


async def run_cli(env: dict[str, str], *args: str) -> Result:
    """``bucketnotify <args>`` with ``env`` and none of the caller's ``BUCKETNOTIFY_*``
    settings or ``KUBECONFIG``; its exit code and output."""
    process = await asyncio.create_subprocess_exec(
        str(BIN / "bucketnotify"),
        *args,
        env={**base_env(), **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode is not None
    return Result(process.returncode, out.decode(), err.decode())
