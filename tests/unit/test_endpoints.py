"""Endpoints without servers: the body and headers they build, how a spec becomes an
endpoint (and which specs are refused), and how failures become outcomes."""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse
from typing import Any

import aiohttp
import pytest
from yarl import URL

from bucketnotify.api.topic import Endpoint as EndpointSpec
from bucketnotify.delivery.endpoints import (
    AuthenticationError,
    ConfigurationError,
    ConnectError,
    Credentials,
    Delivery,
    DestinationNotFound,
    EndpointError,
    EndpointSettings,
    InFlightLimit,
    PushTimeout,
    RejectedError,
    UndeliverableError,
    open_endpoint,
)
from bucketnotify.delivery.endpoints.amqp import AmqpPusher, parse_amqp_url
from bucketnotify.delivery.endpoints.base import BaseEndpoint, outcome_of
from bucketnotify.delivery.endpoints.errors import RequestNotFormed, redact
from bucketnotify.delivery.endpoints.http import HttpPusher, cloud_event_headers, post_body
from bucketnotify.delivery.endpoints.kafka import KafkaPusher, bootstrap_servers, message_key
from bucketnotify.delivery.endpoints.testing import MockEndpoint
from bucketnotify.delivery.ingest.handler import _records
from bucketnotify.delivery.model.push import event_body
from tests.records import s3_record


def spec(kind: str, **fields: Any) -> EndpointSpec:
    return EndpointSpec.model_validate({kind: fields})


def test_the_body_is_the_gateways_records_envelope() -> None:
    """One record, wrapped as the gateway does, compact UTF-8 JSON."""
    record = s3_record(key="ünï/cøde.txt")
    body = event_body(record)
    assert json.loads(body) == {"Records": [record]}
    assert b"\n" not in body and b'", "' not in body
    assert "ünï/cøde.txt".encode() in body


def test_a_queued_record_is_pushed_as_the_ingest_queued_it() -> None:
    """The push wraps the bytes the ingest queued instead of encoding the record again:
    byte for byte what encoding it again gives, numbers and key order included."""
    record = s3_record(key="ünï/cøde.txt")
    record["s3"]["object"]["size"] = 123456789012345678901234567890
    record["s3"]["object"]["ratio"] = 1e16
    parsed = _records(json.dumps({"Records": [record]}).encode())
    assert parsed is not None
    [queued] = parsed[1]
    assert Delivery("1", json.loads(queued), queued).body == event_body(record)
    assert Delivery("1", record).body == event_body(record)
    assert Delivery("1", record, b'{"k": 1}').body == b'{"Records":[{"k": 1}]}'


def test_cloud_event_headers_follow_the_gateway() -> None:
    """ce-* as rgw_pubsub_push.cc builds them, from the reference's example record."""
    record = s3_record(request_id="503a4c37-85eb-47cd-8681-2817e80b4281.5330.903595")
    assert cloud_event_headers(record) == [
        ("ce-specversion", "1.0"),
        ("ce-type", "com.amazonaws.ObjectCreated:Put"),
        ("ce-time", "2019-11-22T13:47:35.124724Z"),
        ("ce-id", "503a4c37-85eb-47cd-8681-2817e80b4281.5330.903595.14d2-zone1-zonegroup1"),
        ("ce-source", "ceph:s3.zonegroup1.mybucket1"),
        ("ce-subject", "myimage1.jpg"),
    ]


def test_cloud_event_headers_of_a_sparse_record_do_not_fail() -> None:
    headers = dict(cloud_event_headers({"eventName": "ObjectCreated:Copy"}))
    assert headers["ce-type"] == "com.amazonaws.ObjectCreated:Copy"
    assert headers["ce-source"] == "ceph:s3.."
    assert headers["ce-id"] == "."


@pytest.mark.parametrize(
    ("key", "subject"),
    [
        ("nl\nkey.txt", "nl%0Akey.txt"),
        ("tab\tkey", "tab%09key"),
        ('100% "sure"', "100%25%20%22sure%22"),
        ("ünï/cøde", "%C3%BCn%C3%AF/c%C3%B8de"),
        (
            "a/b?c=d&e+f#g~h_i.j-k!*'();:@$,[]{}|\\^`<>",
            "a/b?c=d&e+f#g~h_i.j-k!*'();:@$,[]{}|\\^`<>",
        ),
    ],
)
def test_cloud_event_header_values_are_percent_encoded_as_the_binding_says(
    key: str, subject: str
) -> None:
    """CloudEvents HTTP binding 1.0.2, 3.1.3.2: space, '"', '%' and everything outside
    printable ASCII are percent-encoded (UTF-8); the rest of printable ASCII is left alone."""
    headers = cloud_event_headers(s3_record(bucket="b k", key=key))
    assert dict(headers)["ce-subject"] == subject
    assert dict(headers)["ce-source"] == "ceph:s3.zonegroup1.b%20k"
    assert urllib.parse.unquote(subject) == key


async def test_an_event_the_client_cannot_put_in_a_request_stays_queued_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A request we could not form is our defect: retryable (the event is kept), logged at
    ERROR with the event's bucket and key escaped, never classed as undeliverable."""

    class Unformable(HttpPusher):
        async def _push(self, body: bytes, record: dict[str, Any]) -> None:
            raise RequestNotFormed("the request could not be formed: Illegal header value")

    http = spec("http", url="http://127.0.0.1:9").http
    assert http is not None
    endpoint = Unformable(http, ca_pem=None, settings=EndpointSettings())
    with caplog.at_level(logging.ERROR):
        [outcome] = await endpoint.send([Delivery("e1", s3_record(bucket="b", key="nl\nkey"))])
    await endpoint.aclose()
    assert (outcome.ok, outcome.retryable) == (False, True)
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "bucket 'b' key 'nl\\nkey'" in line and "stays queued" in line


async def test_a_request_the_client_refuses_to_form_is_not_final() -> None:
    """aiohttp refuses a header value with a newline before anything is sent: our defect
    (RequestNotFormed, kept queued), not the endpoint's refusal."""
    server = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, aiohttp.ClientSession() as session:
        with pytest.raises(RequestNotFormed, match="control character"):
            await post_body(
                session, URL(f"http://127.0.0.1:{port}/"), b"{}", [("ce-subject", "nl\nkey")], "h"
            )


def test_kafka_key_is_bucket_slash_key() -> None:
    assert message_key(s3_record(bucket="b1", key="a/b c")) == b"b1/a/b c"


@pytest.mark.parametrize(
    ("url", "vhost", "expected"),
    [
        ("amqp://rabbit", None, ("rabbit", 5672, "/", False)),
        ("amqps://rabbit", None, ("rabbit", 5671, "/", True)),
        ("amqp://rabbit:1234/", None, ("rabbit", 1234, "/", False)),
        ("amqp://rabbit/prod", None, ("rabbit", 5672, "prod", False)),
        ("amqp://rabbit/%2f", None, ("rabbit", 5672, "/", False)),
        ("amqp://rabbit", "team-a", ("rabbit", 5672, "team-a", False)),
    ],
)
def test_amqp_url_and_vhost(url: str, vhost: str | None, expected: tuple[Any, ...]) -> None:
    """Ports default as in the reference (5672, 5671 for amqps), vhost to "/"."""
    target = parse_amqp_url(url, vhost)
    assert (target.host, target.port, target.vhost, target.tls) == expected


def test_kafka_brokers_are_the_url_and_the_extra_list_without_repeats() -> None:
    assert bootstrap_servers("kafka://k1", ["k1:9092", "k2:9093", "k3"]) == [
        ("k1", 9092),
        ("k2", 9093),
        ("k3", 9092),
    ]


def test_open_endpoint_picks_the_kind_and_connects_nothing() -> None:
    """Opening never connects: these hosts do not even resolve."""
    http = open_endpoint(
        spec("http", url="https://no-such-host.invalid/x"),
        endpoint_topic="t",
        credentials=None,
        ca_pem=None,
    )
    amqp = open_endpoint(
        spec("amqp", url="amqp://no-such-host.invalid", exchange="x"),
        endpoint_topic="t",
        credentials=None,
        ca_pem=None,
    )
    kafka = open_endpoint(
        spec("kafka", url="kafka://no-such-host.invalid"),
        endpoint_topic="t",
        credentials=None,
        ca_pem=None,
    )
    assert isinstance(http, HttpPusher)
    assert isinstance(amqp, AmqpPusher)
    assert isinstance(kafka, KafkaPusher)


def kafka_sasl(mechanism: str, credentials: tuple[str, str] | None) -> Any:
    return open_endpoint(
        spec(
            "kafka",
            url="kafka://k1",
            sasl={"mechanism": mechanism, "credentialsRef": {"secretName": "s"}},
        ),
        endpoint_topic="t",
        credentials=credentials,
        ca_pem=None,
    )


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"])
def test_supported_sasl_mechanisms_open(mechanism: str) -> None:
    assert isinstance(kafka_sasl(mechanism, ("user", "secret")), KafkaPusher)


def test_gssapi_is_refused_with_a_clear_message() -> None:
    """GSSAPI needs Kerberos, which a user name and password cannot give: refused at open,
    with the mechanisms that work, never per message."""
    with pytest.raises(ConfigurationError) as refused:
        kafka_sasl("GSSAPI", ("user", "secret"))
    message = str(refused.value)
    assert "GSSAPI is not supported" in message and "Kerberos" in message
    assert "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER" in message
    assert "secret" not in message
    assert not refused.value.retryable


def test_sasl_without_credentials_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="needs credentials"):
        kafka_sasl("SCRAM-SHA-512", None)


@pytest.mark.parametrize("ca_pem", ["", "not a certificate", "-----BEGIN CERTIFICATE-----\nxx"])
def test_a_ca_bundle_that_is_not_pem_is_refused(ca_pem: str) -> None:
    with pytest.raises(ConfigurationError, match="CA bundle"):
        open_endpoint(
            spec("http", url="https://h/x"), endpoint_topic="t", credentials=None, ca_pem=ca_pem
        )


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (ConnectError("x"), True),
        (AuthenticationError("x"), True),
        (PushTimeout("x"), True),
        (RejectedError("x"), True),
        (DestinationNotFound("x"), True),
        (UndeliverableError("x"), False),
        (ConfigurationError("x"), False),
        (RequestNotFormed("x"), True),
    ],
)
def test_only_undeliverable_and_configuration_errors_are_final(
    error: EndpointError, retryable: bool
) -> None:
    outcome = outcome_of("id-1", error)
    assert (outcome.id, outcome.ok, outcome.retryable, outcome.error) == (
        "id-1",
        False,
        retryable,
        "x",
    )


def test_outcomes_never_carry_credentials() -> None:
    outcome = outcome_of("i", RejectedError("login alice/s3cr3t refused"), ("alice", "s3cr3t"))
    assert outcome.error == "login ***/*** refused"
    assert redact("pw pw", ["", "pw"]) == "*** ***"
    assert "s3cr3t" not in repr(Credentials("alice", "s3cr3t"))


def test_settings_are_validated() -> None:
    assert EndpointSettings().connect_timeout_s == 5.0
    assert EndpointSettings().message_timeout_s == 10.0
    with pytest.raises(ValueError, match="message_timeout_s"):
        EndpointSettings(message_timeout_s=0)
    with pytest.raises(ValueError, match="max_in_flight"):
        EndpointSettings(max_in_flight=0)


class ScriptedEndpoint(BaseEndpoint):
    """BaseEndpoint around a scripted kind: what the kinds share, without a server."""

    kind = "scripted"

    def __init__(self, push: Any, connect: Any = None, **kw: Any) -> None:
        super().__init__(settings=kw.pop("settings", EndpointSettings()), **kw)
        self.push, self.connect = push, connect
        self.closed_count = 0

    async def _connect(self) -> None:
        if self.connect is not None:
            await self.connect()

    async def _push(self, body: bytes, record: dict[str, Any]) -> None:
        await self.push(record)

    async def _close(self) -> None:
        self.closed_count += 1


async def test_send_turns_every_failure_into_an_outcome(caplog: pytest.LogCaptureFixture) -> None:
    """Ours keep their class; an unexpected exception is a retryable outcome and an ERROR
    log line, both without the secret; one outcome per delivery, in order."""

    async def push(record: dict[str, Any]) -> None:
        key = record["s3"]["object"]["key"]
        if key == "reject":
            raise RejectedError("nope")
        if key == "huge":
            raise UndeliverableError("too large")
        if key == "bug":
            raise KeyError("token=hunter2")

    endpoint = ScriptedEndpoint(push, secrets=("hunter2",))
    keys = ["ok", "reject", "huge", "bug"]
    outcomes = await endpoint.send([Delivery(k, s3_record(key=k)) for k in keys])
    assert [(o.id, o.ok, o.retryable) for o in outcomes] == [
        ("ok", True, False),
        ("reject", False, True),
        ("huge", False, False),
        ("bug", False, True),
    ]
    assert outcomes[3].error == "unexpected error while pushing: KeyError"
    assert "unexpected KeyError" in caplog.text
    assert "hunter2" not in caplog.text


async def test_a_failed_connect_fails_the_whole_batch_without_pushing() -> None:
    pushed: list[Any] = []

    async def push(record: dict[str, Any]) -> None:
        pushed.append(record)

    async def connect() -> None:
        raise ConnectError("broker down")

    outcomes = await ScriptedEndpoint(push, connect).send([Delivery("a", {}), Delivery("b", {})])
    assert [(o.ok, o.retryable, o.error) for o in outcomes] == [(False, True, "broker down")] * 2
    assert pushed == []


async def test_a_push_without_acknowledgement_times_out() -> None:
    async def push(record: dict[str, Any]) -> None:
        await asyncio.sleep(10)

    endpoint = ScriptedEndpoint(push, settings=EndpointSettings(message_timeout_s=0.05))
    [outcome] = await endpoint.send([Delivery("a", {})])
    assert (outcome.ok, outcome.retryable) == (False, True)
    assert outcome.error == "no acknowledgement within 0.05 s"


async def test_in_flight_bounds_per_endpoint_and_shared() -> None:
    running = 0
    peak = 0

    async def push(record: dict[str, Any]) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1

    settings = EndpointSettings(max_in_flight=4)
    batch = [Delivery(str(i), {}) for i in range(20)]
    assert all(o.ok for o in await ScriptedEndpoint(push, settings=settings).send(batch))
    assert peak == 4

    peak = 0
    shared = InFlightLimit(3)
    first = ScriptedEndpoint(push, settings=settings, in_flight=shared)
    second = ScriptedEndpoint(push, settings=settings, in_flight=shared)
    await asyncio.gather(first.send(batch), second.send(batch))
    assert peak == 3
    assert shared.in_flight == 0


async def test_a_closed_endpoint_refuses_to_send_and_closes_once() -> None:
    async def push(record: dict[str, Any]) -> None:
        pass

    endpoint = ScriptedEndpoint(push)
    async with endpoint:
        assert await endpoint.send([]) == []
    await endpoint.aclose()
    assert endpoint.closed_count == 1
    with pytest.raises(RuntimeError, match="closed"):
        await endpoint.send([Delivery("a", {})])


async def test_the_mock_endpoint_derives_outcomes_like_the_real_ones() -> None:
    """MockEndpoint: a sync or async handler acks by returning and fails by raising ours."""

    async def handler(delivery: Delivery) -> None:
        if delivery.id == "late":
            raise PushTimeout("slow")

    endpoint = MockEndpoint(handler)
    outcomes = await endpoint.send([Delivery("a", {}), Delivery("late", {})])
    assert [(o.ok, o.retryable, o.error) for o in outcomes] == [
        (True, False, None),
        (False, True, "slow"),
    ]
    assert [d.id for d in endpoint.delivered] == ["a"]
    assert [[d.id for d in b] for b in endpoint.batches] == [["a", "late"]]

    failing = MockEndpoint.failing(UndeliverableError("too large"))
    [outcome] = await failing.send([Delivery("x", {})])
    assert (outcome.ok, outcome.retryable) == (False, False)
    async with failing:
        pass
    assert failing.closed
    with pytest.raises(RuntimeError):
        await failing.send([])


def test_unexpected_errors_are_logged_at_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    endpoint = ScriptedEndpoint(None)
    error = endpoint._as_endpoint_error(ValueError("boom"), "pushing")
    assert type(error) is EndpointError and error.retryable
    assert "unexpected ValueError while pushing" in caplog.text
