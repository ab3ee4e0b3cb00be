"""The real services of ``deploy/local/`` for pytest: devstack.services, failing the run.

A service that cannot start fails the run with the script's own output (which ends with the
service's log tail): it never skips. Everything else is devstack.services as it is.
"""

from __future__ import annotations

import pytest

from devstack import services
from devstack.services import LOCAL, REPO, RUN_DIR, read_env

__all__ = ["LOCAL", "REPO", "RUN_DIR", "LocalService", "read_env", "start", "stop"]

LocalService = services.Service
"""One running service and whether this test session started it."""


def start(name: str) -> LocalService:
    try:
        return services.start(name)
    except services.ServiceError as exc:
        pytest.fail(str(exc), pytrace=False)


stop = services.stop
