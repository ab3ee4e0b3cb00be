"""One delivery replica as a subprocess, on a local-directory queue store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.delivery import wait_ready
from tests.localservices import LocalService
from tests.operator import HEALTH_INTERVAL_S
from tests.processes import Program, free_port


@pytest.fixture()
def queues(tmp_path: Path) -> Path:
    return tmp_path / "queues"


@pytest.fixture()
def replica_settings() -> dict[str, str]:
    """Extra ``BUCKETNOTIFY_DELIVERY_*`` settings of the ``replica`` (override per module)."""
    return {}


def dir_replica(
    kube: LocalService,
    namespace: str,
    queues: Path,
    identity: str,
    port: int,
    settings: dict[str, str],
) -> Program:
    """A replica on the queue directory ``queues``, its Leases in ``namespace``; Ready."""
    program = Program(
        ["delivery"],
        {
            "KUBECONFIG": kube["KUBECONFIG_ADMIN"],
            "BUCKETNOTIFY_DELIVERY_STORE": f"dir://{queues}",
            "BUCKETNOTIFY_DELIVERY_LISTEN_PORT": str(port),
            "BUCKETNOTIFY_DELIVERY_LEASE_NAMESPACE": namespace,
            "BUCKETNOTIFY_DELIVERY_NAMESPACES": json.dumps([namespace]),
            "BUCKETNOTIFY_DELIVERY_IDENTITY": identity,
            # Drained queues are deleted by the sweep: every 2 s instead of 30.
            "BUCKETNOTIFY_DELIVERY_SWEEP_INTERVAL_SECONDS": "2",
            "BUCKETNOTIFY_DELIVERY_HEALTH_REPORT_INTERVAL_SECONDS": str(HEALTH_INTERVAL_S),
            **{f"BUCKETNOTIFY_DELIVERY_{k}": v for k, v in settings.items()},
        },
    )
    wait_ready(port, program)
    return program


@pytest.fixture()
def replica(
    kube: LocalService, namespace: str, queues: Path, replica_settings: dict[str, str]
) -> Iterator[tuple[Program, int]]:
    port = free_port()
    program = dir_replica(kube, namespace, queues, "replica-1", port, replica_settings)
    yield program, port
    program.stop()
    print(f"--- delivery log ---\n{program.log()[-4000:]}")
