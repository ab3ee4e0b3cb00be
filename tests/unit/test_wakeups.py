"""Wake-ups between replicas: what a wake-up request may say, and where a replica is reached."""

from __future__ import annotations

from typing import Any

import pytest

from bucketnotify.delivery.queue import QueueName
from bucketnotify.delivery.wakeups import MAX_WAKE_SHARDS, parse_wake
from bucketnotify.settings import DeliveryServiceSettings

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
