"""A request the API server refuses with 429 (API Priority and Fairness, or storage still
initialising: not processed) is sent again by the client, as client-go does, a few times
and never past the request's timeout; then the caller gets the ApiError."""

from __future__ import annotations

import itertools
import time

import kopf
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bucketnotify.kube import apiserver
from bucketnotify.kube.apiserver import ApiClient, ApiError


def throttling(refusals: int, seen: list[tuple[str, float]]) -> web.Application:
    """An API server that refuses the first ``refusals`` requests with 429, then creates."""

    async def create(request: web.Request) -> web.Response:
        seen.append((await request.text(), time.monotonic()))
        if len(seen) <= refusals:
            return web.json_response(
                {"kind": "Status", "code": 429, "message": "too many requests"},
                status=429,
                headers={"Retry-After": "1"},
            )
        return web.json_response({"kind": "Lease"}, status=201)

    app = web.Application()
    app.router.add_post("/apis/coordination.k8s.io/v1/namespaces/a/leases", create)
    return app


PATH = "/apis/coordination.k8s.io/v1/namespaces/a/leases"


async def test_a_throttled_create_is_sent_again_and_succeeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(apiserver, "THROTTLED_PAUSE_S", 0.05)
    seen: list[tuple[str, float]] = []
    async with TestServer(throttling(2, seen)) as server:
        info = kopf.ConnectionInfo(server=str(server.make_url("")).rstrip("/"))
        async with ApiClient(info) as api:
            created = await api.create(PATH, {"kind": "Lease"})
    assert created == {"kind": "Lease"}
    assert [body for body, _ in seen] == ['{"kind": "Lease"}'] * 3  # the same request
    pauses = [b - a for (_, a), (_, b) in itertools.pairwise(seen)]
    assert all(pause >= 0.05 * 0.5 for pause in pauses)  # it waited before each


async def test_a_request_throttled_past_its_retries_fails_with_the_429(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(apiserver, "THROTTLED_PAUSE_S", 0.01)
    seen: list[tuple[str, float]] = []
    async with TestServer(throttling(100, seen)) as server:
        info = kopf.ConnectionInfo(server=str(server.make_url("")).rstrip("/"))
        async with ApiClient(info) as api:
            with pytest.raises(ApiError) as refused:
                await api.create(PATH, {"kind": "Lease"})
    assert refused.value.status == 429
    assert len(seen) == 1 + apiserver.THROTTLED_RETRIES


async def test_a_throttled_request_is_not_sent_again_past_its_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Lease renewal has a deadline: a pause that would end after it is not taken."""
    monkeypatch.setattr(apiserver, "THROTTLED_PAUSE_S", 10.0)
    seen: list[tuple[str, float]] = []
    async with TestServer(throttling(100, seen)) as server:
        info = kopf.ConnectionInfo(server=str(server.make_url("")).rstrip("/"))
        async with ApiClient(info) as api:
            with pytest.raises(ApiError):
                await api.create(PATH, {"kind": "Lease"}, request_timeout=0.3)
    assert len(seen) == 1  # Retry-After 1 s (with jitter, at least 0.5 s) is past 0.3 s
