"""The operator as a real subprocess against the local apiserver and gateway."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from devstack.gateway import gateway_settings
from tests.localservices import LocalService
from tests.processes import Program

DRIFT_INTERVAL_S = 3
HEALTH_INTERVAL_S = 2
"""The replicas' health report and the operator's delivery status interval in the tests."""

StartOperator = Callable[..., Program]


@pytest.fixture()
def start_operator(
    kube: LocalService, rgw: LocalService, namespace: str
) -> Iterator[StartOperator]:
    started: list[Program] = []

    def start(
        user: int | None = None, extra_env: dict[str, str] | None = None, **settings: str
    ) -> Program:
        """``settings``: ``BUCKETNOTIFY_<NAME>`` values by lower-case name; ``extra_env``:
        other variables (``AWS_CA_BUNDLE``)."""
        env = {
            "KUBECONFIG": kube["KUBECONFIG_ADMIN"],
            **gateway_settings(rgw),
            "BUCKETNOTIFY_NAMESPACES": json.dumps([namespace]),
            "BUCKETNOTIFY_LEADER_ELECTION_NAMESPACE": namespace,
            "BUCKETNOTIFY_DRIFT_INTERVAL_SECONDS": str(DRIFT_INTERVAL_S),
            # The replicas' health reports: where the tests' replicas put their Leases, and
            # read every 2 s instead of 30.
            "BUCKETNOTIFY_DELIVERY_NAMESPACE": namespace,
            "BUCKETNOTIFY_DELIVERY_STATUS_INTERVAL_SECONDS": str(HEALTH_INTERVAL_S),
            # Off unless a test asks for a port: 9090 may be taken (tests run in parallel).
            "BUCKETNOTIFY_METRICS_PORT": "0",
            **{f"BUCKETNOTIFY_{k.upper()}": v for k, v in settings.items()},
            **(extra_env or {}),
        }
        program = Program(["operator"], env, user=user)
        started.append(program)
        return program

    yield start
    for program in started:
        program.stop()
    for program in started:
        print(f"--- operator log {program.log_path} ---\n{program.log()[-4000:]}")


@pytest.fixture()
def operator(start_operator: StartOperator) -> Program:
    return start_operator()
