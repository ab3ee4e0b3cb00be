"""The HTTP endpoint against real HTTP(S) servers: TLS verification with generated CAs,
CloudEvents headers, status codes, timeouts, keep-alive reuse and in-flight bounds."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bucketnotify.api.topic import Endpoint as EndpointSpec
from bucketnotify.delivery.endpoints import (
    Delivery,
    Endpoint,
    EndpointError,
    EndpointSettings,
    InFlightLimit,
    open_endpoint,
)
from bucketnotify.delivery.endpoints.http import post_json
from devstack.servers.recording import RecordingHttpServer
from tests.processes import free_port
from tests.records import s3_record
from tests.tls import (
    CertificateAuthority,
    ServerCertificate,
    issue_server_certificate,
    make_ca,
)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return make_ca(tmp_path_factory.mktemp("pki"), "endpoint-test-ca")


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return make_ca(tmp_path_factory.mktemp("pki-other"), "some-other-ca")


@pytest.fixture(scope="module")
def server_cert(
    ca: CertificateAuthority, tmp_path_factory: pytest.TempPathFactory
) -> ServerCertificate:
    return issue_server_certificate(ca, Path(tmp_path_factory.mktemp("server")), "receiver")


@pytest.fixture()
def https_server(server_cert: ServerCertificate) -> Iterator[RecordingHttpServer]:
    with RecordingHttpServer(ssl_context=server_cert.server_context()) as server:
        yield server


@pytest.fixture()
def http_server() -> Iterator[RecordingHttpServer]:
    with RecordingHttpServer() as server:
        yield server


def http_endpoint(
    url: str,
    *,
    ca_pem: str | None = None,
    settings: EndpointSettings | None = None,
    in_flight: InFlightLimit | None = None,
    **fields: Any,
) -> Endpoint:
    spec = EndpointSpec.model_validate({"http": {"url": url, **fields}})
    return open_endpoint(
        spec,
        endpoint_topic="unused",
        credentials=None,
        ca_pem=ca_pem,
        settings=settings or EndpointSettings(),
        in_flight=in_flight,
    )


async def test_https_with_the_right_ca_delivers_the_gateway_body(
    https_server: RecordingHttpServer, ca: CertificateAuthority
) -> None:
    """verifySSL with the Topic's CA: the push is a POST of {"Records":[record]} as JSON."""
    record = s3_record()
    async with http_endpoint(https_server.url + "/hook?x=1", ca_pem=ca.pem) as endpoint:
        [outcome] = await endpoint.send([Delivery("e1", record)])
    assert outcome.ok, outcome
    [request] = https_server.received()
    assert request.path == "/hook?x=1"
    assert request.header("content-type") == "application/json"
    assert json.loads(request.body) == {"Records": [record]}
    assert not [name for name, _ in request.headers if name.startswith("ce-")]


async def test_https_with_a_wrong_ca_fails_and_is_retried(
    https_server: RecordingHttpServer, other_ca: CertificateAuthority
) -> None:
    """A server certificate the Topic's CA did not sign is refused; the event stays queued."""
    async with http_endpoint(https_server.url, ca_pem=other_ca.pem) as endpoint:
        [outcome] = await endpoint.send([Delivery("e1", s3_record())])
    assert not outcome.ok
    assert outcome.retryable
    assert outcome.error is not None and "certificate verification failed" in outcome.error
    assert https_server.received() == []


async def test_https_without_a_ca_uses_the_system_cas(https_server: RecordingHttpServer) -> None:
    """Without caRef the system CAs decide, and they do not know the test CA."""
    async with http_endpoint(https_server.url) as endpoint:
        [outcome] = await endpoint.send([Delivery("e1", s3_record())])
    assert not outcome.ok and outcome.retryable
    assert outcome.error is not None and "certificate verification failed" in outcome.error


async def test_verify_ssl_false_accepts_any_certificate(
    https_server: RecordingHttpServer, other_ca: CertificateAuthority
) -> None:
    """verifySSL: false checks neither the chain nor the name (the gateway's verify-ssl)."""
    async with http_endpoint(https_server.url, ca_pem=other_ca.pem, verifySSL=False) as endpoint:
        [outcome] = await endpoint.send([Delivery("e1", s3_record())])
    assert outcome.ok, outcome
    assert len(https_server.received()) == 1


async def test_cloud_events_headers_are_the_gateways(
    https_server: RecordingHttpServer, ca: CertificateAuthority
) -> None:
    """cloudEvents adds exactly the gateway's binary-mode headers, from the record."""
    record = s3_record(
        bucket="photos",
        key="2024/cat.jpg",
        event_name="ObjectRemoved:Delete",
        region="eu-zg",
        request_id="503a4c37.5330.903595",
        id2="14d2-zone1-eu-zg",
        event_time="2024-05-01T10:11:12.345678Z",
    )
    async with http_endpoint(https_server.url, ca_pem=ca.pem, cloudEvents=True) as endpoint:
        [outcome] = await endpoint.send([Delivery("e1", record)])
    assert outcome.ok, outcome
    [request] = https_server.received()
    cloud_events = {name: value for name, value in request.headers if name.startswith("ce-")}
    assert cloud_events == {
        "ce-specversion": "1.0",
        "ce-type": "com.amazonaws.ObjectRemoved:Delete",
        "ce-time": "2024-05-01T10:11:12.345678Z",
        "ce-id": "503a4c37.5330.903595.14d2-zone1-eu-zg",
        "ce-source": "ceph:s3.eu-zg.photos",
        "ce-subject": "2024/cat.jpg",
    }
    assert request.header("content-type") == "application/json"
    assert json.loads(request.body) == {"Records": [record]}


@pytest.mark.parametrize(
    ("status", "ok", "retryable"),
    [(200, True, False), (204, True, False), (302, False, True), (404, False, True),
     (500, False, True), (503, False, True), (413, False, False)],
)  # fmt: skip
async def test_only_a_2xx_is_an_acknowledgement(
    http_server: RecordingHttpServer, status: int, ok: bool, retryable: bool
) -> None:
    """Any 2xx acks; anything else is retried, except 413 (too large: retrying cannot help)."""
    http_server.status = status
    async with http_endpoint(http_server.url) as endpoint:
        [outcome] = await endpoint.send([Delivery("e1", s3_record())])
    assert (outcome.ok, outcome.retryable) == (ok, retryable), outcome
    if not ok:
        assert outcome.error is not None and f"answered {status}" in outcome.error


async def test_a_slow_endpoint_times_out_and_is_retried(http_server: RecordingHttpServer) -> None:
    """No answer within the message timeout is a failure to retry, not a hang."""
    http_server.delay_s = 2.0
    settings = EndpointSettings(message_timeout_s=0.5)
    async with http_endpoint(http_server.url, settings=settings) as endpoint:
        [outcome] = await endpoint.send([Delivery("e1", s3_record())])
    # The server answers 200 after 2 s: had the push waited for it, the outcome would be ok.
    assert not outcome.ok and outcome.retryable
    assert outcome.error is not None and "0.5 s" in outcome.error


async def test_connections_are_kept_alive_and_reused(http_server: RecordingHttpServer) -> None:
    """Consecutive batches travel over one pooled connection (one client port)."""
    async with http_endpoint(http_server.url) as endpoint:
        for n in range(5):
            [outcome] = await endpoint.send([Delivery(f"e{n}", s3_record())])
            assert outcome.ok, outcome
    ports = {request.client_port for request in http_server.received()}
    assert len(ports) == 1


async def test_in_flight_is_bounded_per_endpoint(http_server: RecordingHttpServer) -> None:
    """max_in_flight pushes at once, however large the batch; all of it is delivered."""
    http_server.delay_s = 0.1
    settings = EndpointSettings(max_in_flight=3)
    async with http_endpoint(http_server.url, settings=settings) as endpoint:
        outcomes = await endpoint.send([Delivery(f"e{n}", s3_record()) for n in range(12)])
    assert [o.id for o in outcomes] == [f"e{n}" for n in range(12)]
    assert all(o.ok for o in outcomes), outcomes
    assert http_server.max_concurrent == 3
    assert len({r.client_port for r in http_server.received()}) <= 3


async def test_a_shared_in_flight_limit_bounds_several_endpoints(
    http_server: RecordingHttpServer,
) -> None:
    """One InFlightLimit passed to several endpoints is a global bound (the gateway's
    rgw_http_notif_max_inflight)."""
    http_server.delay_s = 0.1
    limit = InFlightLimit(2)
    async with (
        http_endpoint(http_server.url, in_flight=limit) as first,
        http_endpoint(http_server.url, in_flight=limit) as second,
    ):
        batch = [Delivery(f"e{n}", s3_record()) for n in range(5)]
        results = await asyncio.gather(first.send(batch), second.send(batch))
    assert all(o.ok for outcomes in results for o in outcomes)
    assert http_server.max_concurrent == 2
    assert limit.in_flight == 0


async def test_an_unreachable_endpoint_fails_every_push_retryably() -> None:
    """Nothing listens: each push fails fast with a retryable connect error."""
    port = free_port()
    async with http_endpoint(f"http://127.0.0.1:{port}/x") as endpoint:
        outcomes = await endpoint.send([Delivery("a", s3_record()), Delivery("b", s3_record())])
    assert [o.ok for o in outcomes] == [False, False]
    assert all(o.retryable for o in outcomes)
    assert outcomes[0].error is not None
    assert f"could not connect to http://127.0.0.1:{port}" in outcomes[0].error


async def test_post_json_for_the_operators_test_event(http_server: RecordingHttpServer) -> None:
    """post_json (the operator's test event) acks on 2xx and raises EndpointError otherwise."""
    await post_json(http_server.url, {"Records": [s3_record()]})
    assert len(http_server.received()) == 1
    http_server.status = 500
    with pytest.raises(EndpointError, match="answered 500"):
        await post_json(http_server.url, {"Records": []})


async def test_an_idle_connection_the_endpoint_closed_is_not_reused() -> None:
    """An endpoint that closes kept-alive connections after each answer (as a keep-alive
    timeout does): the next push must notice and connect anew, not fail on the dead one."""
    connections = 0

    async def answer_once_then_close(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        nonlocal connections
        connections += 1
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()

    server = await asyncio.start_server(answer_once_then_close, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, http_endpoint(f"http://127.0.0.1:{port}/") as endpoint:
        for n in range(3):
            [outcome] = await endpoint.send([Delivery(f"e{n}", s3_record())])
            assert outcome.ok, outcome
            await asyncio.sleep(0.2)  # the endpoint has closed it by now
    assert connections == 3


async def test_pushes_go_through_the_proxy_the_environment_names(
    http_server: RecordingHttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$HTTP_PROXY is honoured (as by every HTTP client), and $NO_PROXY exempts a host."""
    monkeypatch.setenv("HTTP_PROXY", http_server.url)
    monkeypatch.setenv("NO_PROXY", "exempt.invalid")
    # Nothing resolves .invalid: only the proxy can have received the push.
    async with http_endpoint("http://receiver.invalid:8080/hook?token=t") as endpoint:
        [outcome] = await endpoint.send([Delivery("e1", s3_record())])
    assert outcome.ok, outcome
    [request] = http_server.received()
    assert request.path == "http://receiver.invalid:8080/hook?token=t"
    async with http_endpoint("http://exempt.invalid:8080/hook") as endpoint:
        [outcome] = await endpoint.send([Delivery("e2", s3_record())])
    assert not outcome.ok and outcome.retryable
    assert (
        outcome.error is not None
        and "could not connect to http://exempt.invalid:8080" in outcome.error
    )
    assert http_server.received() == []  # nothing more reached the proxy


SECRET_PATH = "/hooks/path-S3CRET"
SECRET_QUERY = "?token=query-S3CRET"


@pytest.mark.parametrize("failure", ["refused", "answered 500", "timeout", "wrong CA"])
async def test_an_error_never_shows_the_urls_path_or_query(
    failure: str,
    http_server: RecordingHttpServer,
    https_server: RecordingHttpServer,
    other_ca: CertificateAuthority,
) -> None:
    """A webhook's token often lives in its path or query: an error (in a record, a log
    line, an Event, the Topic's status) names only scheme://host:port, whatever failed."""
    ca_pem = None
    settings = EndpointSettings()
    base = http_server.url
    if failure == "refused":
        base = f"http://127.0.0.1:{free_port()}"
    elif failure == "answered 500":
        http_server.status = 500
    elif failure == "timeout":
        http_server.delay_s = 2.0
        settings = EndpointSettings(message_timeout_s=0.3)
    else:
        base, ca_pem = https_server.url, other_ca.pem
    url = base.rstrip("/") + SECRET_PATH + SECRET_QUERY
    async with http_endpoint(url, ca_pem=ca_pem, settings=settings) as endpoint:
        [outcome] = await endpoint.send([Delivery("e1", s3_record())])
    assert not outcome.ok and outcome.error, outcome
    assert "S3CRET" not in outcome.error, outcome.error
    if failure == "timeout":
        return  # "no acknowledgement within 0.3 s"; the test event waits longer
    where = base.rstrip("/").split("/")[2]
    assert where in outcome.error, outcome.error
    with pytest.raises(EndpointError) as raised:
        await post_json(url, {"Records": []})
    assert where in str(raised.value)
    assert "S3CRET" not in str(raised.value) and "S3CRET" not in repr(raised.value)
