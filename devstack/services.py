"""The real local services of ``deploy/local/``: started, reused and stopped by their scripts.

Each service has a script ``deploy/local/<name>.sh start|stop|status`` that writes its
connection details to ``$BN_RUN/<name>/env``. A service that cannot start raises
``ServiceError`` with the script's own output, which ends with the service's log tail.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "LOCAL",
    "REPO",
    "RUN_DIR",
    "Service",
    "ServiceError",
    "ceph_release",
    "pid_of",
    "read_env",
    "start",
    "state_dir",
    "stop",
]

REPO = Path(__file__).resolve().parent.parent
LOCAL = REPO / "deploy" / "local"
RUN_DIR = Path(os.environ.get("BN_RUN", "/tmp/bucketnotify-local"))

# A cold start may first build the apiserver (minutes); a warm one takes seconds.
START_TIMEOUT_S = 1800
# The Ceph release ceph.sh runs when CEPH_RELEASE does not name one.
DEFAULT_CEPH_RELEASE = "tentacle"


def state_dir(name: str, run_dir: Path = RUN_DIR) -> Path:
    """Where ``deploy/local/<name>.sh`` keeps a service's state and env file: Ceph's is per
    release (``CEPH_RELEASE``), so that several releases run side by side."""
    if name == "ceph":
        return run_dir / f"ceph-{ceph_release()}"
    return run_dir / name


def ceph_release() -> str:
    """The Ceph release ``deploy/local/ceph.sh`` runs in this environment."""
    return os.environ.get("CEPH_RELEASE") or DEFAULT_CEPH_RELEASE


class ServiceError(RuntimeError):
    """A local service is missing, did not start, or left no connection details."""


@dataclass
class Service:
    """One running service, its connection details and whether this run started it."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    started_here: bool = False

    def __getitem__(self, key: str) -> str:
        try:
            return self.env[key]
        except KeyError:
            raise ServiceError(
                f"{state_dir(self.name) / 'env'} has no {key}: is it from an older "
                f"deploy/local/{self.name}.sh? Restart the service with it."
            ) from None


def read_env(path: Path) -> dict[str, str]:
    """The ``KEY=value`` lines of a service's env file."""
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    return env


def _script(name: str, action: str, timeout: float) -> subprocess.CompletedProcess[str]:
    script = LOCAL / f"{name}.sh"
    if not script.exists():
        raise ServiceError(f"no start script {script}")
    return subprocess.run(
        ["bash", str(script), action],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start(name: str) -> Service:
    """The running service ``name``, started first when it is not running."""
    running = _script(name, "status", 60).returncode == 0
    if not running:
        print(f"starting local service {name} (deploy/local/{name}.sh start) ...", flush=True)
        result = _script(name, "start", START_TIMEOUT_S)
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-60:])
            raise ServiceError(
                f"local service {name!r} did not start (is it installed? `make "
                f"services-install`):\n{tail}"
            )
    env_file = state_dir(name) / "env"
    if not env_file.exists():
        raise ServiceError(f"local service {name!r} is up but wrote no {env_file}")
    return Service(name=name, env=read_env(env_file), started_here=not running)


def stop(service: Service) -> None:
    """Stop what this run started, unless BN_KEEP_SERVICES=1 keeps it warm for the next."""
    if service.started_here and os.environ.get("BN_KEEP_SERVICES") != "1":
        _script(service.name, "stop", 120)


def pid_of(name: str, pid_file: str) -> int | None:
    """The pid a service's script recorded, or None when it recorded none."""
    try:
        return int((state_dir(name) / pid_file).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
