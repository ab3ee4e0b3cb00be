"""Where a test reads the records a real endpoint received: HTTP or RabbitMQ."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol

import aio_pika

from devstack.servers.recording import HttpReceiver


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


# Ceph 16.2 keeps one AMQP connection per broker URL and binds it to the first exchange it
# was used with; a topic naming another exchange on the same broker fails with "exchange
# mismatch". Every test therefore shares one exchange and tells topics apart by routing key.
SHARED_EXCHANGE = "bucketnotify-e2e"


class AmqpSink:
    """A queue bound to the shared topic exchange by the gateway topic's name (routing key)."""

    def __init__(self, url: str, host: str, port: str, routing_key: str) -> None:
        self._url = url
        self.exchange = SHARED_EXCHANGE
        self._routing_key = routing_key
        self.endpoint = {"amqp": {"url": f"amqp://{host}:{port}", "exchange": self.exchange}}

    async def start(self) -> AmqpSink:
        self._connection = await aio_pika.connect_robust(self._url)
        channel = await self._connection.channel()
        exchange = await channel.declare_exchange(
            self.exchange, aio_pika.ExchangeType.TOPIC, durable=True
        )
        self._queue = await channel.declare_queue(exclusive=True)
        await self._queue.bind(exchange, routing_key=self._routing_key)
        return self

    async def next_body(self, timeout_s: float = 20) -> dict[str, Any]:
        # basic.get answers at once: a record the gateway has not yet published (ackLevel
        # none returns the S3 request before the broker has it) is waited for here.
        deadline = asyncio.get_running_loop().time() + timeout_s
        while (message := await self._queue.get(fail=False)) is None:
            assert asyncio.get_running_loop().time() < deadline, (
                f"no record on the queue bound by {self._routing_key!r} in {timeout_s} s"
            )
            await asyncio.sleep(0.05)
        await message.ack()
        body: dict[str, Any] = json.loads(message.body)
        return body

    async def close(self) -> None:
        await self._connection.close()
