"""Wake-ups between replicas: what a wake-up request may say, where a replica is reached, and
the wake-up the ingest waits for."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bucketnotify.delivery.model.queue import QueueName
from bucketnotify.delivery.peers.wakeups import MAX_WAKE_SHARDS, WakeUps, parse_wake
from bucketnotify.metrics import DeliveryMetrics
from bucketnotify.settings import DeliveryServiceSettings
from devstack.programs import free_port

ANY_V4 = "0.0.0.0"  # noqa: S104 (a pod's listen setting: nothing binds it here)


def test_a_wake_up_names_queues_and_shards() -> None:
    body = {"shards": [["ns", "topic", 0], ["ns", "other", 7]]}
    assert parse_wake(body) == [(QueueName("ns", "topic"), 0), (QueueName("ns", "other"), 7)]
    assert parse_wake({"shards": []}) == []


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        {"shard": []},
        {"shards": "ns/topic/0"},
        {"shards": [["ns", "topic"]]},
        {"shards": [["ns", "topic", "0"]]},
        {"shards": [["ns", "topic", True]]},
        {"shards": [["ns", "topic", -1]]},
        {"shards": [["", "topic", 0]]},
        {"shards": [["ns", 5, 0]]},
        {"shards": [["ns", "topic", 0]] * (MAX_WAKE_SHARDS + 1)},
    ],
)
def test_anything_else_is_refused(body: Any) -> None:
    assert parse_wake(body) is None


@pytest.mark.parametrize(
    ("env", "address"),
    [
        ({}, "127.0.0.1:8085"),
        ({"LISTEN_HOST": ANY_V4}, None),
        ({"LISTEN_HOST": "::"}, None),
        ({"LISTEN_HOST": ANY_V4, "ADVERTISE_HOST": "10.1.2.3"}, "10.1.2.3:8085"),
        ({"LISTEN_HOST": "::", "ADVERTISE_HOST": "fd00::7"}, "[fd00::7]:8085"),
        ({"LISTEN_HOST": "replica.example", "LISTEN_PORT": "9000"}, "replica.example:9000"),
    ],
)
def test_a_replica_advertises_where_it_can_be_reached(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], address: str | None
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(f"BUCKETNOTIFY_DELIVERY_{name}", value)
    assert DeliveryServiceSettings().advertised_address == address


async def test_tell_returns_once_the_owner_has_the_wake_up() -> None:
    """The ingest awaits it before answering the gateway: the owner must have it by then."""
    got: list[Any] = []

    async def wake(request: web.Request) -> web.Response:
        got.append(await request.json())
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/v1/wake", wake)
    metrics = DeliveryMetrics()
    async with TestServer(app) as server:
        owner = f"{server.host}:{server.port}"
        queue = QueueName("ns", "t")
        wakeups = WakeUps(lambda q, shard: owner if shard < 2 else None, metrics)
        try:
            await wakeups.tell(queue, [0, 1, 2])
            assert got == [{"shards": [["ns", "t", 0], ["ns", "t", 1]]}]
            sent = metrics.registry.get_sample_value
            assert sent("bucketnotify_wakeups_sent_total", {"outcome": "ok"}) == 2
        finally:
            await wakeups.aclose()


async def test_tell_gives_up_on_an_owner_that_does_not_answer() -> None:
    metrics = DeliveryMetrics()
    wakeups = WakeUps(lambda q, shard: f"127.0.0.1:{free_port()}", metrics)
    try:
        await wakeups.tell(QueueName("ns", "t"), [0])
    finally:
        await wakeups.aclose()
    sent = metrics.registry.get_sample_value
    assert sent("bucketnotify_wakeups_sent_total", {"outcome": "failed"}) == 1
