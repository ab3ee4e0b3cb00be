"""A failure a loop tries again is one WARNING line while it is transient; what needs a person
is an ERROR with its traceback."""

from __future__ import annotations

import logging

import aiohttp
import pytest

from bucketnotify.gateway.errors import GatewayUnreachable
from bucketnotify.kube.apiserver import ApiError, log_retried

STARTING = ApiError(
    429,
    "Too Many Requests",
    '{"kind":"Status","message":"storage is (re)initializing","code":429}',
)


@pytest.mark.parametrize(
    "exc",
    [
        STARTING,
        ApiError(503, "Service Unavailable"),
        aiohttp.ServerDisconnectedError(),
        TimeoutError(),
    ],
    ids=["429 starting", "503", "disconnected", "timeout"],
)
def test_a_transient_failure_is_one_warning_line(
    exc: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        log_retried(logging.getLogger("t"), "refreshing the topic table failed", exc)
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.exc_info is None
    assert "\n" not in record.getMessage()
    assert record.getMessage().startswith("refreshing the topic table failed")
    if exc is STARTING:
        assert "storage is (re)initializing" in record.getMessage()


@pytest.mark.parametrize(
    "exc", [ApiError(403, "Forbidden"), ApiError(422, "Unprocessable"), KeyError("spec")]
)
def test_what_needs_a_person_is_an_error_with_its_traceback(
    exc: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        log_retried(logging.getLogger("t"), "refreshing the topic table failed", exc)
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None and record.exc_info[1] is exc


def test_another_services_unavailability_is_transient_where_the_caller_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    exc = GatewayUnreachable("the gateway did not answer")
    with caplog.at_level(logging.DEBUG):
        log_retried(logging.getLogger("t"), "sweeping the queues failed", exc)
        log_retried(
            logging.getLogger("t"), "sweeping the queues failed", exc, (GatewayUnreachable,)
        )
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.WARNING]
