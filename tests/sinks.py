"""Where a test reads the records a real endpoint received: HTTP, RabbitMQ or Kafka."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any, Protocol

import aio_pika
from aiokafka import AIOKafkaConsumer

from tests.receivers import HttpReceiver


class Sink(Protocol):
    endpoint: dict[str, Any]
    """The Topic's spec.endpoint that delivers here."""

    async def next_body(self, timeout_s: float = 20) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class HttpSink:
    def __init__(self) -> None:
        self._receiver = HttpReceiver().__enter__()
        self.endpoint = {"http": {"url": self._receiver.url}}

    async def next_body(self, timeout_s: float = 20) -> dict[str, Any]:
        body: dict[str, Any] = await asyncio.to_thread(self._receiver.bodies.get, timeout=timeout_s)
        return body

    async def close(self) -> None:
        self._receiver.__exit__()


class AmqpSink:
    """A queue bound to a topic exchange by the gateway topic's name (the routing key)."""

    def __init__(self, url: str, host: str, port: str, routing_key: str) -> None:
        self._url = url
        self.exchange = f"bn-e2e-{uuid.uuid4().hex[:8]}"
        self._routing_key = routing_key
        self.endpoint = {"amqp": {"url": f"amqp://{host}:{port}", "exchange": self.exchange}}

    async def start(self) -> AmqpSink:
        self._connection = await aio_pika.connect_robust(self._url)
        channel = await self._connection.channel()
        exchange = await channel.declare_exchange(self.exchange, aio_pika.ExchangeType.TOPIC)
        self._queue = await channel.declare_queue(exclusive=True)
        await self._queue.bind(exchange, routing_key=self._routing_key)
        return self

    async def next_body(self, timeout_s: float = 20) -> dict[str, Any]:
        message = await self._queue.get(timeout=timeout_s, fail=True)
        assert message is not None
        await message.ack()
        body: dict[str, Any] = json.loads(message.body)
        return body

    async def close(self) -> None:
        await self._connection.close()


class KafkaSink:
    """A consumer of the Kafka topic named like the gateway topic."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        host, _, port = bootstrap.partition(":")
        self.endpoint = {"kafka": {"url": f"kafka://{host}:{port}"}}
        self._consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )

    async def start(self) -> KafkaSink:
        await self._consumer.start()
        return self

    async def next_body(self, timeout_s: float = 20) -> dict[str, Any]:
        record = await asyncio.wait_for(self._consumer.getone(), timeout=timeout_s)
        body: dict[str, Any] = json.loads(record.value)
        return body

    async def close(self) -> None:
        await self._consumer.stop()
