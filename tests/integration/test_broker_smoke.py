"""The local RabbitMQ and Kafka are real brokers, usable with the clients the endpoints use."""

from __future__ import annotations

import asyncio
import uuid

import aio_pika
import pytest
from aio_pika.exceptions import DeliveryError
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from tests.localservices import LocalService


async def test_rabbitmq_publisher_confirms_and_consume(rabbitmq: LocalService) -> None:
    """A confirmed publish to a topic exchange is routed to a bound queue and consumed."""
    suffix = uuid.uuid4().hex[:8]
    connection = await aio_pika.connect_robust(rabbitmq["AMQP_URL"])
    async with connection:
        # on_return_raises: a message the broker returns as unroutable is an error, not a
        # silent success (aio-pika's default).
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchange = await channel.declare_exchange(
            f"smoke-{suffix}", aio_pika.ExchangeType.TOPIC, durable=True
        )
        queue = await channel.declare_queue(f"smoke-{suffix}", durable=True)
        await queue.bind(exchange, routing_key="events")

        body = b'{"Records": []}'
        confirmation = await exchange.publish(
            aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key="events",
            mandatory=True,
        )
        assert confirmation is not None  # a broker ack, not a fire-and-forget

        message = await queue.get(timeout=10, fail=True)
        assert message is not None
        assert message.body == body
        await message.ack()

        # Nothing is bound for this key: with mandatory the broker returns the message.
        with pytest.raises(DeliveryError):
            await exchange.publish(
                aio_pika.Message(body), routing_key="nobody-listens", mandatory=True
            )
        await queue.delete(if_unused=False, if_empty=False)
        await exchange.delete()


async def test_kafka_produce_acks_all_and_consume(kafka: LocalService) -> None:
    """A message acknowledged by the broker (acks=all) is consumed back from the topic."""
    topic = f"smoke-{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(bootstrap_servers=kafka["KAFKA_BOOTSTRAP"], acks="all")
    await producer.start()
    try:
        metadata = await producer.send_and_wait(topic, b'{"Records": []}', key=b"bucket/key")
        assert metadata.topic == topic
        assert metadata.offset == 0
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka["KAFKA_BOOTSTRAP"],
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        record = await asyncio.wait_for(consumer.getone(), timeout=30)
        assert record.value == b'{"Records": []}'
        assert record.key == b"bucket/key"
    finally:
        await consumer.stop()
