"""Start, reuse and stop the real services of ``deploy/local/`` from pytest.

Each service has a script ``deploy/local/<name>.sh start|stop|status`` that writes its
connection details to ``$BN_RUN/<name>/env``. A service that cannot start fails the run with
the script's own output (which ends with the service's log tail): it never skips.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LOCAL = REPO / "deploy" / "local"
RUN_DIR = Path(os.environ.get("BN_RUN", "/tmp/bucketnotify-local"))

# Cold starts: the apiserver may first have to be built (minutes); the others take seconds.
START_TIMEOUT_S = 1800


@dataclass
class LocalService:
    """One running service and whether this test session started it."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    started_here: bool = False

    def __getitem__(self, key: str) -> str:
        return self.env[key]


def read_env(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    return env


def _script(name: str, action: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(LOCAL / f"{name}.sh"), action],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start(name: str) -> LocalService:
    running = _script(name, "status", 60).returncode == 0
    if not running:
        result = _script(name, "start", START_TIMEOUT_S)
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-60:])
            pytest.fail(f"local service {name!r} did not start:\n{tail}", pytrace=False)
    env_file = RUN_DIR / name / "env"
    if not env_file.exists():
        pytest.fail(f"local service {name!r} is up but wrote no {env_file}", pytrace=False)
    return LocalService(name=name, env=read_env(env_file), started_here=not running)


def stop(service: LocalService) -> None:
    # BN_KEEP_SERVICES=1 keeps what a run started, so the next run is warm.
    if service.started_here and os.environ.get("BN_KEEP_SERVICES") != "1":
        _script(service.name, "stop", 120)
