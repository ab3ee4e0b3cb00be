"""Services of ``deploy/local/`` that belong to one test: a state dir and ports of their own.

The session services of tests/conftest.py are shared by every test, so nothing may stop or
restart them. A fault test that kills a gateway, an apiserver or a broker starts one of its
own here, through the same script with ``BN_RUN`` and the port variables moved, and may do
to it whatever the script offers (``restart``, ``gateway-stop``, ``apiserver-stop``...).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from devstack.services import state_dir
from tests.localservices import LOCAL, LocalService, read_env
from tests.processes import free_port

# Each script's port variables (see the header of deploy/local/<name>.sh).
PORT_VARIABLES = {
    "ceph": ("CEPH_RGW_PORT", "CEPH_RGW_TLS_PORT", "CEPH_MON_PORT", "CEPH_MON_V2_PORT"),
    "kube": ("KUBE_PORT", "ETCD_PORT", "ETCD_PEER_PORT"),
    "rabbitmq": ("RABBITMQ_PORT", "RABBITMQ_TLS_PORT", "RABBITMQ_DIST_PORT", "RABBITMQ_EPMD_PORT"),
    "kafka": (
        "KAFKA_PORT",
        "KAFKA_CONTROLLER_PORT",
        "KAFKA_SASL_PORT",
        "KAFKA_SSL_PORT",
        "KAFKA_SASL_SSL_PORT",
        "KAFKA_MTLS_PORT",
    ),
}
# A second node of the same name would clash with the shared broker's in epmd and logs.
EXTRA = {"rabbitmq": {"RABBITMQ_NODE": "bucketnotify-own@localhost"}, "ceph": {}}


class OwnService:
    """One service of a test's own, driven by its ``deploy/local/<name>.sh``."""

    def __init__(self, name: str, run_dir: Path) -> None:
        self.name = name
        self._run_dir = run_dir
        self._env = {
            **os.environ,
            "BN_RUN": str(run_dir),
            **{variable: str(free_port()) for variable in PORT_VARIABLES[name]},
            **EXTRA.get(name, {}),
        }

    def script(self, action: str, timeout: float = 600) -> None:
        result = subprocess.run(
            ["bash", str(LOCAL / f"{self.name}.sh"), action],
            env=self._env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        output = (result.stdout + result.stderr)[-3000:]
        assert result.returncode == 0, f"{self.name}.sh {action} failed:\n{output}"

    @property
    def state_dir(self) -> Path:
        """Where its script keeps the service's state, pid file and log."""
        return state_dir(self.name, self._run_dir)

    @property
    def env(self) -> dict[str, str]:
        return read_env(self.state_dir / "env")

    def service(self) -> LocalService:
        """The connection details, in the shape the session fixtures give."""
        return LocalService(self.name, self.env)


@contextmanager
def own_service(name: str, run_dir: Path) -> Iterator[OwnService]:
    """Started on entry, stopped (state deleted) on exit whatever the test did to it."""
    service = OwnService(name, run_dir)
    try:
        service.script("start")
        yield service
    finally:
        service.script("stop")
