"""Watching the three endpoints while the objects are uploaded: the HTTP receiver's file, a
RabbitMQ queue bound to the AMQP Topic's routing key, and the Kafka Topic's topic.

Every arrival is printed as it comes, with its latency (arrival minus the gateway's
``eventTime``), then compared with what the filters must let through: each expected event
exactly once, nothing else.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import aio_pika
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from demo.console import DemoError, info
from demo.uploads import Expected

__all__ = [
    "AmqpWatcher",
    "Arrival",
    "HttpWatcher",
    "KafkaWatcher",
    "Watcher",
    "check",
    "collect",
    "delete_amqp_queue",
]

# A queue of the demo's own, durable, so events published while nobody consumes stay.
AMQP_QUEUE = "bucketnotify-demo"


@dataclass(frozen=True)
class Arrival:
    endpoint: str
    event_name: str
    key: str
    latency: float | None

    @classmethod
    def of(cls, endpoint: str, record: dict[str, Any], at: float) -> Arrival:
        latency = None
        try:
            sent = datetime.fromisoformat(record["eventTime"].replace("Z", "+00:00"))
            latency = at - sent.timestamp()
        except (KeyError, ValueError, AttributeError):
            pass
        return cls(endpoint, record["eventName"], record["s3"]["object"]["key"], latency)


Sink = Callable[[Arrival], None]


def _records(body: bytes) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = json.loads(body)["Records"]
    return records


class HttpWatcher:
    """Follows the JSON-lines journal the demo's HTTP endpoint (``devstack.servers.arrivals``)
    appends every POSTed record to."""

    kind = "http"

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0

    async def start(self) -> HttpWatcher:
        self._offset = self._path.stat().st_size
        return self

    async def run(self, sink: Sink) -> None:
        while True:
            with self._path.open("rb") as f:
                f.seek(self._offset)
                for line in f:
                    if not line.endswith(b"\n"):
                        break
                    self._offset += len(line)
                    arrival = json.loads(line)
                    sink(Arrival.of(self.kind, arrival["record"], arrival["received_at"]))
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        return None


class AmqpWatcher:
    """Declares the exchange the AMQP Topic publishes to (the delivery service only looks
    it up) and a queue bound to its routing key, emptied of earlier runs' messages."""

    kind = "amqp"

    def __init__(self, url: str, exchange: str, routing_key: str) -> None:
        self._url = url
        self.exchange = exchange
        self.routing_key = routing_key

    async def start(self) -> AmqpWatcher:
        self._connection = await aio_pika.connect_robust(self._url)
        channel = await self._connection.channel()
        exchange = await channel.declare_exchange(
            self.exchange, aio_pika.ExchangeType.TOPIC, durable=True
        )
        self._queue = await channel.declare_queue(AMQP_QUEUE, durable=True)
        await self._queue.bind(exchange, routing_key=self.routing_key)
        await self._queue.purge()
        return self

    async def run(self, sink: Sink) -> None:
        async with self._queue.iterator() as messages:
            async for message in messages:
                at = time.time()
                async with message.process():
                    for record in _records(message.body):
                        sink(Arrival.of(self.kind, record, at))

    async def close(self) -> None:
        if hasattr(self, "_connection"):
            await self._connection.close()


async def delete_amqp_queue(url: str) -> None:
    """Removes the demo's queue; a broker that is down has nothing to remove."""
    try:
        connection = await aio_pika.connect(url)
    except (OSError, aio_pika.exceptions.AMQPException):
        return
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(AMQP_QUEUE)


class KafkaWatcher:
    """Reads the Kafka Topic's topic from its end as it was before the uploads."""

    kind = "kafka"

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._bootstrap = bootstrap
        self.topic = topic

    async def start(self) -> KafkaWatcher:
        admin = AIOKafkaAdminClient(bootstrap_servers=self._bootstrap)
        await admin.start()
        try:
            if self.topic not in await admin.list_topics():
                # Its answer is not checked: a topic created meanwhile is as good.
                await admin.create_topics([NewTopic(self.topic, 1, 1)])
            partitions = await self._partitions(admin)
        finally:
            await admin.close()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap, enable_auto_commit=False
        )
        await self._consumer.start()
        self._consumer.assign(partitions)
        await self._consumer.seek_to_end(*partitions)
        for partition in partitions:
            # Resolve the end now, not at the first fetch after the uploads.
            await self._consumer.position(partition)
        return self

    async def _partitions(self, admin: AIOKafkaAdminClient) -> list[TopicPartition]:
        for _ in range(100):
            for topic in await admin.describe_topics([self.topic]):
                if topic["topic"] == self.topic and topic["partitions"]:
                    return [TopicPartition(self.topic, p["partition"]) for p in topic["partitions"]]
            await asyncio.sleep(0.2)
        raise DemoError(f"Kafka topic {self.topic} has no partitions after 20 s")

    async def run(self, sink: Sink) -> None:
        async for message in self._consumer:
            at = time.time()
            for record in _records(message.value):
                sink(Arrival.of(self.kind, record, at))

    async def close(self) -> None:
        if hasattr(self, "_consumer"):
            await self._consumer.stop()


class Watcher(Protocol):
    kind: str

    async def start(self) -> Watcher: ...

    async def run(self, sink: Sink) -> None: ...

    async def close(self) -> None: ...


async def collect(
    watchers: list[Watcher],
    expected: Expected,
    act: Callable[[], Awaitable[None]],
    wait_s: float,
    grace_s: float,
) -> dict[str, Counter[tuple[str, str]]]:
    """Runs ``act`` (the uploads) while every watcher listens; returns what arrived per
    endpoint once every expected event did and ``grace_s`` more seconds passed (an unexpected
    event would have come by then), or after ``wait_s``."""
    got: dict[str, Counter[tuple[str, str]]] = {w.kind: Counter() for w in watchers}
    latencies: dict[str, list[float]] = {w.kind: [] for w in watchers}

    def sink(arrival: Arrival) -> None:
        got[arrival.endpoint][arrival.event_name, arrival.key] += 1
        latency = "?" if arrival.latency is None else f"{arrival.latency:5.2f} s"
        if arrival.latency is not None:
            latencies[arrival.endpoint].append(arrival.latency)
        info(f"{arrival.endpoint:<6} {arrival.event_name:<22} {arrival.key:<26} after {latency}")

    tasks = [asyncio.create_task(w.run(sink)) for w in watchers]
    try:
        await act()
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not _all_arrived(got, expected):
            for task in tasks:
                if task.done():
                    task.result()  # a watcher that failed says why
            await asyncio.sleep(0.2)
        await asyncio.sleep(grace_s)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for kind, values in latencies.items():
        if values:
            values.sort()
            info(
                f"{kind}: {len(values)} events, latency median {values[len(values) // 2]:.2f} s,"
                f" max {values[-1]:.2f} s"
            )
    return got


def _all_arrived(got: dict[str, Counter[tuple[str, str]]], expected: Expected) -> bool:
    return all(
        got[kind][event] >= n for kind, want in expected.items() for event, n in want.items()
    )


def check(got: dict[str, Counter[tuple[str, str]]], expected: Expected) -> list[str]:
    """What is wrong, per endpoint: missing events, duplicates, events the filter should
    have left out. Empty when every expected event arrived exactly once and nothing else."""
    problems = []
    for kind, want in expected.items():
        have = got[kind]
        for event, n in sorted(want.items()):
            if have[event] < n:
                problems.append(f"{kind}: {event[0]} {event[1]} did not arrive")
            elif have[event] > n:
                problems.append(f"{kind}: {event[0]} {event[1]} arrived {have[event]} times")
        for event in sorted(have.keys() - want.keys()):
            problems.append(f"{kind}: {event[0]} {event[1]} arrived, but its filter excludes it")
    return problems
