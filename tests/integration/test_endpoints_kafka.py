"""The Kafka endpoint against the real broker's four listeners (PLAINTEXT, SASL_PLAINTEXT,
SSL, SASL_SSL): ack levels, message keys, every SASL mechanism but GSSAPI, TLS with the broker's CA,
refused credentials, unreachable brokers, and a real restart of a broker of the test's own."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import errors as kafka_errors
from aiokafka.structs import ConsumerRecord

from bucketnotify.api.topic import Endpoint as EndpointSpec
from bucketnotify.delivery.endpoints import (
    Delivery,
    Endpoint,
    EndpointSettings,
    PushOutcome,
    open_endpoint,
)
from bucketnotify.delivery.endpoints.kafka import KafkaPusher
from bucketnotify.delivery.model.push import event_body
from tests.localservices import LocalService
from tests.ownservices import OwnService, own_service
from tests.processes import free_port
from tests.records import s3_record
from tests.tls import make_ca


def kafka_endpoint(
    url: str,
    topic: str,
    *,
    credentials: tuple[str, str] | None = None,
    ca_pem: str | None = None,
    settings: EndpointSettings | None = None,
    **fields: Any,
) -> Endpoint:
    spec = EndpointSpec.model_validate({"kafka": {"url": url, **fields}})
    return open_endpoint(
        spec,
        endpoint_topic=topic,
        credentials=credentials,
        ca_pem=ca_pem,
        settings=settings or EndpointSettings(),
    )


def new_topic() -> str:
    return f"bn-ep-{uuid.uuid4().hex[:10]}"


async def consume(bootstrap: str, topic: str, count: int, timeout_s: float = 30) -> list[Any]:
    """``count`` records of ``topic`` from the start, read over the PLAINTEXT listener."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    try:
        records: list[ConsumerRecord[bytes, bytes]] = []
        while len(records) < count:
            records.append(await asyncio.wait_for(consumer.getone(), timeout=timeout_s))
        return records
    finally:
        await consumer.stop()


def deliveries(n: int, prefix: str = "e") -> list[Delivery]:
    return [Delivery(f"{prefix}{i}", s3_record(key=f"obj-{prefix}{i}")) for i in range(n)]


@pytest.mark.parametrize("ack_level", ["none", "broker"])
async def test_produces_the_gateway_body_keyed_by_bucket_and_key(
    kafka: LocalService, ack_level: str
) -> None:
    """Topic = the endpoint topic, value = {"Records":[record]}, key = bucket/key; with
    acks=0 (none) and acks=all (broker)."""
    topic = new_topic()
    batch = [Delivery(f"e{i}", s3_record(bucket="photos", key=f"dir/k{i}")) for i in range(3)]
    async with kafka_endpoint(
        f"kafka://{kafka['KAFKA_BOOTSTRAP']}", topic, ackLevel=ack_level
    ) as endpoint:
        outcomes = await endpoint.send(batch)
    assert [(o.id, o.ok) for o in outcomes] == [(d.id, True) for d in batch], outcomes
    records = await consume(kafka["KAFKA_BOOTSTRAP"], topic, 3)
    assert sorted(r.value for r in records) == sorted(event_body(d.record) for d in batch)
    assert sorted(r.key for r in records) == [b"photos/dir/k0", b"photos/dir/k1", b"photos/dir/k2"]
    assert json.loads(records[0].value)["Records"][0]["s3"]["bucket"]["name"] == "photos"


def unsecured_jwt(subject: str) -> str:
    """An unsigned JWT, which the broker's default OAUTHBEARER validator accepts."""

    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    now = int(time.time())
    return f"{part({'alg': 'none'})}.{part({'sub': subject, 'iat': now, 'exp': now + 3600})}."


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN", "OAUTHBEARER"])
async def test_sasl_delivers(kafka: LocalService, mechanism: str) -> None:
    """SASL over the SASL_PLAINTEXT listener: SCRAM and PLAIN with the Secret's user and
    password, OAUTHBEARER with the Secret's password as the bearer token."""
    topic = new_topic()
    credentials = (kafka["KAFKA_SCRAM_USER"], kafka["KAFKA_SCRAM_PASSWORD"])
    if mechanism == "OAUTHBEARER":
        credentials = ("unused", unsecured_jwt("bucketnotify-test"))
    sasl = {"mechanism": mechanism, "credentialsRef": {"secretName": "s"}}
    async with kafka_endpoint(
        f"kafka://{kafka['KAFKA_SASL_BOOTSTRAP']}", topic, credentials=credentials, sasl=sasl
    ) as endpoint:
        outcomes = await endpoint.send(deliveries(2))
    assert all(o.ok for o in outcomes), outcomes
    assert len(await consume(kafka["KAFKA_BOOTSTRAP"], topic, 2)) == 2


async def test_wrong_sasl_credentials_are_reported_without_printing_them(
    kafka: LocalService, caplog: pytest.LogCaptureFixture
) -> None:
    """A refused SCRAM login is a retryable authentication error; the password shows
    nowhere (outcome or log, DEBUG included) and the user name not in the outcome."""
    caplog.set_level(logging.DEBUG)
    user, password = kafka["KAFKA_SCRAM_USER"], "Wr0ng-k4fka-p4ss-5d21"
    sasl = {"mechanism": "SCRAM-SHA-512", "credentialsRef": {"secretName": "s"}}
    async with kafka_endpoint(
        f"kafka://{kafka['KAFKA_SASL_BOOTSTRAP']}",
        new_topic(),
        credentials=(user, password),
        sasl=sasl,
    ) as endpoint:
        outcomes = await endpoint.send(deliveries(2))
    assert [(o.ok, o.retryable) for o in outcomes] == [(False, True)] * 2
    error = outcomes[0].error
    assert error == (
        f"{kafka['KAFKA_SASL_BOOTSTRAP']} refused the credentials from the Secret"
        " (SASL SCRAM-SHA-512)"
    )
    assert user not in error and password not in error
    assert password not in caplog.text


async def test_ssl_verifies_the_broker_with_the_topics_ca(
    kafka: LocalService, tmp_path: Path
) -> None:
    """useSSL with the broker's CA delivers; another CA is refused (retryably) with the
    reason; verifySSL: false delivers anyway."""
    topic = new_topic()
    url = f"kafka://{kafka['KAFKA_SSL_BOOTSTRAP']}"
    broker_ca = await asyncio.to_thread(Path(kafka["KAFKA_CA_PEM"]).read_text)
    async with kafka_endpoint(url, topic, ca_pem=broker_ca, useSSL=True) as endpoint:
        [outcome] = await endpoint.send([Delivery("right-ca", s3_record())])
    assert outcome.ok, outcome

    other = make_ca(tmp_path, "not-the-brokers-ca")
    async with kafka_endpoint(url, topic, ca_pem=other.pem, useSSL=True) as endpoint:
        [outcome] = await endpoint.send([Delivery("wrong-ca", s3_record())])
    assert not outcome.ok and outcome.retryable
    assert outcome.error is not None and "certificate verification failed" in outcome.error

    async with kafka_endpoint(url, topic, useSSL=True, verifySSL=False) as endpoint:
        [outcome] = await endpoint.send([Delivery("no-verify", s3_record())])
    assert outcome.ok, outcome
    assert len(await consume(kafka["KAFKA_BOOTSTRAP"], topic, 2)) == 2


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
async def test_sasl_over_ssl_delivers_and_verifies_the_broker(
    kafka: LocalService, tmp_path: Path, mechanism: str
) -> None:
    """sasl + useSSL: SASL_SSL to the broker's SASL_SSL listener, the login inside TLS checked
    with the Topic's CA; another CA is refused retryably before any credential is sent, and a
    wrong password over TLS is an authentication error like over plain SASL."""
    topic = new_topic()
    url = f"kafka://{kafka['KAFKA_SASL_SSL_BOOTSTRAP']}"
    broker_ca = await asyncio.to_thread(Path(kafka["KAFKA_CA_PEM"]).read_text)
    credentials = (kafka["KAFKA_SCRAM_USER"], kafka["KAFKA_SCRAM_PASSWORD"])
    sasl = {"mechanism": mechanism, "credentialsRef": {"secretName": "s"}}

    batch = deliveries(2)
    async with kafka_endpoint(
        url, topic, credentials=credentials, ca_pem=broker_ca, sasl=sasl, useSSL=True
    ) as endpoint:
        outcomes = await endpoint.send(batch)
    assert all(o.ok for o in outcomes), outcomes

    other = make_ca(tmp_path, "not-the-brokers-ca")
    async with kafka_endpoint(
        url, topic, credentials=credentials, ca_pem=other.pem, sasl=sasl, useSSL=True
    ) as endpoint:
        [outcome] = await endpoint.send([Delivery("wrong-ca", s3_record())])
    assert not outcome.ok and outcome.retryable
    assert outcome.error is not None and "certificate verification failed" in outcome.error

    async with kafka_endpoint(
        url,
        topic,
        credentials=(credentials[0], "Wr0ng-k4fka-p4ss-77c1"),
        ca_pem=broker_ca,
        sasl=sasl,
        useSSL=True,
    ) as endpoint:
        [outcome] = await endpoint.send([Delivery("wrong-password", s3_record())])
    assert (outcome.ok, outcome.retryable) == (False, True)
    assert outcome.error == (
        f"{kafka['KAFKA_SASL_SSL_BOOTSTRAP']} refused the credentials from the Secret"
        f" (SASL {mechanism})"
    )
    # Only the two pushed with the right CA and password reached the topic.
    records = await consume(kafka["KAFKA_BOOTSTRAP"], topic, 2)
    assert sorted(r.value for r in records) == sorted(event_body(d.record) for d in batch)


async def test_unreachable_brokers_fail_pushes_retryably() -> None:
    """No broker listens: the batch fails at once, retryably, naming the brokers."""
    port = free_port()
    settings = EndpointSettings(connect_timeout_s=2)
    async with kafka_endpoint(
        f"kafka://127.0.0.1:{port}", new_topic(), settings=settings
    ) as endpoint:
        outcomes = await endpoint.send(deliveries(2))
    assert [(o.ok, o.retryable) for o in outcomes] == [(False, True)] * 2
    assert outcomes[0].error is not None and f"127.0.0.1:{port}" in outcomes[0].error


async def test_the_extra_broker_list_is_used(kafka: LocalService) -> None:
    """The URL's broker is down, one of kafka-brokers is up: the events are delivered."""
    topic = new_topic()
    url = f"kafka://127.0.0.1:{free_port()}"
    async with kafka_endpoint(url, topic, brokers=[kafka["KAFKA_BOOTSTRAP"]]) as endpoint:
        [outcome] = await endpoint.send([Delivery("e1", s3_record())])
    assert outcome.ok, outcome
    assert len(await consume(kafka["KAFKA_BOOTSTRAP"], topic, 1)) == 1


async def test_an_event_too_large_is_not_retried(kafka: LocalService) -> None:
    """An event over the producer's request size can never be delivered: not retryable."""
    record = s3_record()
    record["opaqueData"] = "x" * (1024 * 1024 + 1)
    async with kafka_endpoint(f"kafka://{kafka['KAFKA_BOOTSTRAP']}", new_topic()) as endpoint:
        outcomes = await endpoint.send([Delivery("big", record), Delivery("small", s3_record())])
    assert [(o.ok, o.retryable) for o in outcomes] == [(False, False), (True, False)]
    assert outcomes[0].error is not None and "too large" in outcomes[0].error


@pytest.fixture()
def own_kafka(tmp_path: Path) -> Iterator[OwnService]:
    with own_service("kafka", tmp_path / "run") as broker:
        yield broker


async def send_until_acked(
    endpoint: Endpoint, batch: list[Delivery], *, within_s: float
) -> list[PushOutcome]:
    """What the delivery worker does: resend what was not acknowledged until all is."""
    deadline = asyncio.get_running_loop().time() + within_s
    pending = {d.id: d for d in batch}
    failed: list[PushOutcome] = []
    while pending:
        for outcome in await endpoint.send(list(pending.values())):
            assert outcome.ok or outcome.retryable, outcome
            if outcome.ok:
                del pending[outcome.id]
            else:
                failed.append(outcome)
        if pending:
            assert asyncio.get_running_loop().time() < deadline, f"still failing: {failed[-1]}"
            await asyncio.sleep(0.2)
    return failed


async def broker_answers(bootstrap: str) -> bool:
    host, _, port = bootstrap.rpartition(":")
    try:
        _, writer = await asyncio.open_connection(host, int(port))
    except OSError:
        return False
    writer.close()
    return True


async def test_a_broker_restart_under_a_steady_stream_loses_nothing(own_kafka: OwnService) -> None:
    """The broker stops and starts again (same data) in the middle of a stream: pushes fail
    retryably meanwhile, nothing raises, the producer reconnects by itself, and with the
    worker's retries every event is in the topic afterwards."""
    topic = new_topic()
    bootstrap = own_kafka.env["KAFKA_BOOTSTRAP"]
    settings = EndpointSettings(connect_timeout_s=2, message_timeout_s=3)
    failures: list[PushOutcome] = []
    async with kafka_endpoint(f"kafka://{bootstrap}", topic, settings=settings) as endpoint:
        # The restart starts at a fixed point of the stream and the stream goes on while
        # the broker is away: on a busy machine a restart after a sleep can miss it.
        restarting: asyncio.Task[None] | None = None
        for n in range(40):
            if n == 10:
                restarting = asyncio.create_task(asyncio.to_thread(own_kafka.script, "restart"))
                # Wait for the broker to go away, so the next sends meet the outage.
                while not restarting.done() and await broker_answers(bootstrap):  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            failures.extend(await send_until_acked(endpoint, deliveries(5, f"s{n}-"), within_s=90))
            await asyncio.sleep(0.1)
        assert restarting is not None
        await restarting
    assert failures, "the restart did not hit the stream"
    assert all(o.retryable for o in failures)
    # At least once: a push whose acknowledgement the restart swallowed was sent again.
    expected = {f"obj-s{n}-{i}".encode() for n in range(40) for i in range(5)}
    seen: set[bytes] = set()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        while not expected <= seen:
            record = await asyncio.wait_for(consumer.getone(), timeout=30)
            assert record.key is not None
            seen.add(record.key.split(b"/", 1)[1])
    finally:
        await consumer.stop()
    assert seen == expected


async def test_a_push_that_outlives_its_wait_is_not_produced_again(
    own_kafka: OwnService,
) -> None:
    """The broker freezes (SIGSTOP) under a push: the wait ends at the message timeout while
    the producer still holds the send. The worker retries the event once the broker is
    back, and the topic holds it once, not twice."""
    topic = new_topic()
    bootstrap = own_kafka.env["KAFKA_BOOTSTRAP"]
    broker = int((own_kafka.state_dir / "pid").read_text())
    settings = EndpointSettings(connect_timeout_s=5, message_timeout_s=2)
    warm, frozen = Delivery("warm", s3_record(key="warm")), Delivery("f", s3_record(key="f"))
    async with kafka_endpoint(
        f"kafka://{bootstrap}", topic, settings=settings, ackLevel="broker"
    ) as endpoint:
        # The topic exists and the producer knows its leader: the push below only waits
        # for the broker's answer.
        await send_until_acked(endpoint, [warm], within_s=60)
        os.kill(broker, signal.SIGSTOP)
        try:
            (timed_out,) = await endpoint.send([frozen])
            await asyncio.sleep(1)
        finally:
            os.kill(broker, signal.SIGCONT)
        assert not timed_out.ok and timed_out.retryable, timed_out
        assert timed_out.error is not None and "within 2 s" in timed_out.error
        await send_until_acked(endpoint, [frozen], within_s=60)
    records = await consume(bootstrap, topic, 2)
    assert [r.key for r in records] == [b"mybucket1/warm", b"mybucket1/f"]
    # Anything produced twice would follow within the wait.
    with pytest.raises(TimeoutError):
        await consume(bootstrap, topic, 3, timeout_s=5)


async def test_a_producer_that_lost_its_sequence_state_is_replaced_and_the_event_produced(
    kafka: LocalService,
) -> None:
    """A broker that lost the idempotent producer's state (killed and started again) makes
    aiokafka fail the producer's sends with ``OutOfOrderSequenceNumber``, and every send
    after. The endpoint replaces the producer: the failed push is retryable, the event's
    next attempt goes out through a new producer, and the topic holds every event once.

    The state loss itself cannot be made on demand (a broker restart causes it in about one
    run in two): the running producer's sends are made to fail as aiokafka's sender fails
    them; the broker, the topic and the new producer are real."""
    topic = new_topic()
    bootstrap = kafka["KAFKA_BOOTSTRAP"]
    first, lost = Delivery("first", s3_record(key="first")), Delivery("lost", s3_record(key="lost"))
    async with kafka_endpoint(f"kafka://{bootstrap}", topic, ackLevel="broker") as endpoint:
        await send_until_acked(endpoint, [first], within_s=60)
        assert isinstance(endpoint, KafkaPusher)
        broken = endpoint._producer

        async def send_fails(*args: Any, **kwargs: Any) -> asyncio.Future[Any]:
            failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            failed.set_exception(kafka_errors.OutOfOrderSequenceNumber())
            return failed

        broken.send = send_fails
        (outcome,) = await endpoint.send([lost])
        assert not outcome.ok and outcome.retryable, outcome
        assert outcome.error is not None and "OutOfOrderSequenceNumber" in outcome.error
        (again,) = await endpoint.send([lost])
        assert again.ok, again
        assert endpoint._producer is not broken
    records = await consume(bootstrap, topic, 2)
    assert [r.key for r in records] == [b"mybucket1/first", b"mybucket1/lost"]
    with pytest.raises(TimeoutError):
        await consume(bootstrap, topic, 3, timeout_s=5)
