"""Fixtures of the install tests: the helm CLI (built by deploy/local/helm.sh)."""

from __future__ import annotations

import pytest

from tests.install.manifests import helm_binary


@pytest.fixture(scope="session")
def helm_bin() -> str:
    """helm from its Go module; a build that fails fails the test, it never skips."""
    try:
        return helm_binary()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
