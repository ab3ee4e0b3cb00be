"""A handler the API server refuses for now (429 from API Priority and Fairness, a 5xx, no
connection) is a wait, not a failure: kopf's TemporaryError with a short delay (a WARNING
line, "failed temporarily"), counted as a retry; kopf would take the ApiError itself for a
failure, log it at ERROR with a traceback and wait 60 s."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from bucketnotify.controller.handlers import API_RETRY_DELAY_S, _measured
from bucketnotify.kube.apiserver import ApiError
from bucketnotify.metrics import OperatorMetrics


def sample(metrics: OperatorMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return value or 0.0


async def test_a_throttled_handler_is_retried_soon_and_counted_as_a_retry() -> None:
    metrics = OperatorMetrics()

    @_measured("topic", "change")
    async def handler(**_: Any) -> None:
        raise ApiError(429, "Too Many Requests", '{"kind":"Status","code":429}')

    with pytest.raises(kopf.TemporaryError) as raised:
        await handler(memo=kopf.Memo(metrics=metrics))
    assert raised.value.delay == API_RETRY_DELAY_S
    assert "429" in str(raised.value)
    assert raised.value.__cause__ is None  # no traceback of the request to log
    labels = {"kind": "topic", "action": "change"}
    assert sample(metrics, "bucketnotify_reconcile_total", **labels, result="retry") == 1
    errors = {"kind": "topic", "reason": "ApiServerUnavailable"}
    assert sample(metrics, "bucketnotify_reconcile_errors_total", **errors) == 1


async def test_a_refused_request_stays_a_failure() -> None:
    metrics = OperatorMetrics()

    @_measured("topic", "change")
    async def handler(**_: Any) -> None:
        raise ApiError(403, "Forbidden", '{"kind":"Status","code":403}')

    with pytest.raises(ApiError):
        await handler(memo=kopf.Memo(metrics=metrics))
    labels = {"kind": "topic", "action": "change", "result": "error"}
    assert sample(metrics, "bucketnotify_reconcile_total", **labels) == 1
