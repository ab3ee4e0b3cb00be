"""A Topic the replica cannot serve is said once and plainly: a failure the next refresh may
get over (the API server throttling: 429) as a WARNING without traceback, at most once a
minute per Topic; one that needs a person as one ERROR, without traceback, until it changes.
A throttling API server fails every Topic at every refresh: a traceback each would bury the
one line that matters."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import kopf
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bucketnotify.delivery.stores.localdir import LocalDirStore
from bucketnotify.kube import apiserver
from bucketnotify.kube.apiserver import ApiClient
from tests.delivery import lone_service

TOPIC = {
    "apiVersion": "bucketnotify.io/v1alpha1",
    "kind": "Topic",
    "metadata": {"namespace": "team-a", "name": "t", "uid": "u1", "generation": 1},
    "spec": {"persistent": True, "endpoint": {"http": {"url": "http://127.0.0.1:9/"}}},
}


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's own pauses before sending a throttled request again, shortened."""
    monkeypatch.setattr(apiserver, "THROTTLED_PAUSE_S", 0.01)


async def test_a_throttled_topic_warns_once_and_a_refused_one_errs_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Each refresh's read of the token Secret: refused with 429 until the client gives up
    # asking again (twice), then refused for good with 403 (twice).
    phases = [429, 429, 403, 403]
    reads: list[int] = []

    async def topics(request: web.Request) -> web.Response:
        return web.json_response({"kind": "TopicList", "items": [TOPIC]})

    async def secret(request: web.Request) -> web.Response:
        status = phases[0]
        reads.append(status)
        message = {429: "too many requests, please try again later", 403: "forbidden"}
        return web.json_response(
            {"kind": "Status", "code": status, "message": message[status]}, status=status
        )

    app = web.Application()
    app.router.add_get("/apis/bucketnotify.io/v1alpha1/topics", topics)
    app.router.add_get("/api/v1/namespaces/{namespace}/secrets/{name}", secret)
    async with TestServer(app) as server:
        info = kopf.ConnectionInfo(server=str(server.make_url("")).rstrip("/"))
        async with ApiClient(info) as api:
            service = lone_service(api, LocalDirStore(tmp_path))
            with caplog.at_level(logging.DEBUG, logger="bucketnotify"):
                for _ in range(4):
                    await service.table.refresh()
                    phases.pop(0)
            await service.table.aclose()
    # Each throttled read was sent again by the client itself before the table saw it.
    assert reads.count(429) == 2 * (1 + apiserver.THROTTLED_RETRIES)
    assert reads.count(403) == 2
    said = [
        r
        for r in caplog.records
        if r.name == "bucketnotify.delivery.topics.table" and r.levelno >= logging.WARNING
    ]
    assert [r.levelno for r in said] == [logging.WARNING, logging.ERROR]
    assert all(r.exc_info is None for r in said)
    warning, error = (r.getMessage() for r in said)
    assert "team-a/t" in warning and "429" in warning and "tried again" in warning
    assert "team-a/t" in error and "403" in error and "until the Topic" in error
    assert ("team-a", "t") not in service.table.ingest_topics


async def test_a_topic_looked_up_while_the_api_server_throttles_is_asked_again(
    tmp_path: Path,
) -> None:
    """The first push of a Topic the replica does not know yet (``resolve``) meets 429s,
    more than the client itself sends again: the lookup asks again after a short pause
    instead of failing the push."""
    answers = [429] * (1 + apiserver.THROTTLED_RETRIES) * 2 + [200]
    token = "t0ken-0123456789"

    async def topic(request: web.Request) -> web.Response:
        status = answers.pop(0)
        if status == 429:
            return web.json_response({"kind": "Status", "code": 429}, status=429)
        return web.json_response(TOPIC)

    async def secret(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "kind": "Secret",
                "metadata": {"name": "t-ingest-token", "namespace": "team-a", "labels": {}},
                "data": {"token": base64.b64encode(token.encode()).decode()},
            }
        )

    app = web.Application()
    app.router.add_get("/apis/bucketnotify.io/v1alpha1/namespaces/team-a/topics/t", topic)
    app.router.add_get("/api/v1/namespaces/{namespace}/secrets/{name}", secret)
    async with TestServer(app) as server:
        info = kopf.ConnectionInfo(server=str(server.make_url("")).rstrip("/"))
        async with ApiClient(info) as api:
            service = lone_service(api, LocalDirStore(tmp_path))
            found = await service.table.resolve("team-a", "t")
            await service.table.aclose()
    assert answers == []
    assert found is not None and found.accepts(token)
