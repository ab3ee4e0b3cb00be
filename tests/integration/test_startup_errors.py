"""A replica or operator that cannot start says what to fix as its last words: one line, exit
status 1, and no error of its own clean-up after it (real apiserver, the real CLI)."""

from __future__ import annotations

import pytest

from tests.localservices import LocalService
from tests.processes import run_cli


@pytest.mark.parametrize(
    ("store", "message"),
    [
        ("ftp://queues", "BUCKETNOTIFY_DELIVERY_STORE: use dir:///absolute/path or s3://bucket"),
        # Valid, but its records directory beside it cannot be made.
        ("dir:///proc/queues", "BUCKETNOTIFY_DELIVERY_RECORDS: cannot write to /proc/records"),
    ],
)
async def test_a_delivery_replica_with_a_bad_store_setting_says_only_what_to_fix(
    kube: LocalService, store: str, message: str
) -> None:
    result = await run_cli(
        {"KUBECONFIG": kube["KUBECONFIG_ADMIN"], "BUCKETNOTIFY_DELIVERY_STORE": store},
        "delivery",
    )
    assert result.code == 1, result
    lines = [line for line in result.err.splitlines() if line.strip()]
    # Its API sessions are closed on the way out: asyncio's "Unclosed client session" errors
    # used to follow the message.
    assert len(lines) == 1 and lines[0].startswith(message), result.err


async def test_an_operator_refused_its_first_request_says_only_what_to_fix(
    kube: LocalService,
) -> None:
    result = await run_cli({"KUBECONFIG": kube["KUBECONFIG_NOBODY"]}, "operator")
    assert result.code == 1, result
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1, result.err
    assert "the API server refused a request (403 Forbidden)" in lines[0]
    assert "check the ServiceAccount's credentials and RBAC" in lines[0]
