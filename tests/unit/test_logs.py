"""Log redaction and the JSON/plain formats of bucketnotify.logs."""

from __future__ import annotations

import base64
import io
import json
import logging
from collections.abc import Iterator

import kopf
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bucketnotify import logs
from bucketnotify.kube.apiserver import ApiClient
from bucketnotify.kube.objects import Kube


@pytest.fixture()
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger writing through a configured (JSON) handler into a buffer."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    stream = io.StringIO()
    logs.configure("json", "DEBUG", stream=stream)
    try:
        yield logging.getLogger("bucketnotify.test"), stream
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "cannot connect to amqp://alice:pa55word@127.0.0.1:5672/vh",
            "cannot connect to amqp://***@127.0.0.1:5672/vh",
        ),
        ("kafka://tok3n@broker:9092", "kafka://***@broker:9092"),
        (
            "GET https://h/x?token=abc123&b=1&password=hunter22",
            "GET https://h/x?token=***&b=1&password=***",
        ),
        (
            "https://b.s3/k?X-Amz-Credential=AKIA/x&X-Amz-Signature=deadbeef",
            "https://b.s3/k?X-Amz-Credential=***&X-Amz-Signature=***",
        ),
        ("Authorization: Bearer eyJabc.def", "Authorization: Bearer ***"),
        (
            "{'Authorization': 'AWS4-HMAC-SHA256 Credential=AK/2026, Signature=ff', 'H': 1}",
            "{'Authorization': 'AWS4-HMAC-SHA256 ***', 'H': 1}",
        ),
        ("authorization=Basic YWxpY2U6cHc=", "authorization=Basic ***"),
        ("sent with bearer abc.def-ghi", "sent with bearer ***"),
        (
            "POST http://ingest:8085/v1/topics/team-a/hook/Zm9vYmFy-token HTTP/1.1",
            "POST http://ingest:8085/v1/topics/team-a/hook/*** HTTP/1.1",
        ),
        # Nothing secret: left as it is.
        ("queue team-a/hook shard 3: delivered 5", "queue team-a/hook shard 3: delivered 5"),
        ("http://127.0.0.1:18000/bucket/key", "http://127.0.0.1:18000/bucket/key"),
    ],
)
def test_redact_patterns(text: str, expected: str) -> None:
    assert logs.redact(text) == expected


def test_remembered_secret_values_are_redacted_longest_first() -> None:
    logs.remember_secrets(["abcdef-secret-value", "abcdef-secret-value-longer", "short"])
    assert logs.redact("x abcdef-secret-value-longer y") == "x *** y"
    assert logs.redact("x abcdef-secret-value y") == "x *** y"
    # Too short to be told apart from ordinary words: not remembered.
    assert logs.redact("a short note") == "a short note"


def test_remembered_secrets_are_redacted_in_base64_too() -> None:
    logs.remember_secrets(["base64-me-please"])
    assert (
        logs.redact('"data":{"password":"YmFzZTY0LW1lLXBsZWFzZQ=="}') == '"data":{"password":"***"}'
    )


def test_secret_objects_in_api_responses_lose_their_data() -> None:
    """An API server's answer may reach a log line (an HTTP client's DEBUG output, an
    error's body), a Secret read before any of its values could be remembered included."""
    body = (
        'response body: b\'{"kind":"Secret","apiVersion":"v1","metadata":'
        '{"name":"t-ingest-token"},"data":{"token":"bmV2ZXItc2Vlbg=="},'
        '"type":"Opaque"}\''
    )
    redacted = logs.redact(body)
    assert "bmV2ZXItc2Vlbg==" not in redacted
    assert '"data":{***}' in redacted and "t-ingest-token" in redacted
    # Other objects keep their data: a ConfigMap's is no secret.
    config_map = '{"kind":"ConfigMap","data":{"ca.crt":"PEM"}}'
    assert logs.redact(config_map) == config_map


async def test_a_secret_read_through_kube_at_debug_logs_none_of_its_values(
    captured: tuple[logging.Logger, io.StringIO], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator's own Secret read (``Kube`` over ``apiserver.ApiClient``) with DEBUG on
    for aiohttp and bucketnotify: the log shows neither the Secret's values (plain or base64,
    as its ``data`` holds them) nor the bearer token the client logs in with."""
    _, stream = captured
    for variable in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(variable, raising=False)
    values = {"token": "n3ver-seen-ingest-token", "password": "n3ver-seen-password"}
    bearer = "n3ver-seen-bearer-token"
    authorizations: list[str | None] = []

    async def read_secret(request: web.Request) -> web.Response:
        authorizations.append(request.headers.get("Authorization"))
        return web.json_response(
            {
                "kind": "Secret",
                "apiVersion": "v1",
                "metadata": {
                    "name": request.match_info["name"],
                    "namespace": request.match_info["namespace"],
                    "resourceVersion": "7",
                },
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()},
                "type": "Opaque",
            }
        )

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{namespace}/secrets/{name}", read_secret)
    debug = [logging.getLogger(name) for name in ("aiohttp", "bucketnotify")]
    saved = [logger.level for logger in debug]
    for logger in debug:
        logger.setLevel(logging.DEBUG)
    try:
        assert logging.getLogger("aiohttp.client").isEnabledFor(logging.DEBUG)
        assert logging.getLogger("bucketnotify.kube.objects").isEnabledFor(logging.DEBUG)
        async with TestServer(app) as server:
            info = kopf.ConnectionInfo(server=str(server.make_url("")).rstrip("/"), token=bearer)
            async with ApiClient(info) as api:
                data = await Kube(api).secret_data("team-a", "t-ingest-token")
    finally:
        for logger, level in zip(debug, saved, strict=True):
            logger.setLevel(level)
    assert data == values
    assert authorizations == [f"Bearer {bearer}"]
    logged = stream.getvalue()
    for value in (*values.values(), bearer):
        assert value not in logged
        assert base64.b64encode(value.encode()).decode() not in logged


def test_secret_key_names() -> None:
    assert all(
        logs.secret_key_name(k) for k in ("password", "secretKey", "token", "client-credentials")
    )
    assert not any(logs.secret_key_name(k) for k in ("username", "accessKey", "endpoint", "ca"))


def test_json_record_has_the_fields_and_no_secret_in_message_args_extra_or_exception(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = captured
    secret = "r3member-me-not"
    logs.remember_secrets([secret])
    try:
        raise ValueError(f"driver said amqp://u:{secret}@h and password={secret}")
    except ValueError:
        logger.exception("push to %s failed", f"amqp://u:{secret}@h", extra={"url": secret})
    logger.info("plain %d", 3)
    failed, plain = lines(stream)
    assert secret not in stream.getvalue()
    assert failed["severity"] == "error"
    assert failed["logger"] == "bucketnotify.test"
    assert failed["message"] == "push to amqp://***@h failed"
    assert failed["url"] == "***"
    assert "ValueError: driver said amqp://***@h and password=***" in str(failed["exc_info"])
    assert isinstance(failed["timestamp"], str) and failed["timestamp"].endswith("+00:00")
    assert plain["message"] == "plain 3" and plain["severity"] == "info"


def test_kopf_object_reference_becomes_the_object_field(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = captured
    ref = {"apiVersion": "bucketnotify.io/v1alpha1", "kind": "Topic", "name": "t", "uid": None}
    logger.info("synced", extra={"k8s_ref": ref, "k8s_skip": False, "settings": object()})
    (record,) = lines(stream)
    assert record["object"] == {
        "apiVersion": "bucketnotify.io/v1alpha1",
        "kind": "Topic",
        "name": "t",
    }
    assert "settings" not in record and "k8s_skip" not in record


def test_plain_format_prefixes_the_object_and_redacts() -> None:
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    stream = io.StringIO()
    try:
        assert logs.configure("auto", "INFO", stream=stream) == "json"  # not a terminal
        assert logs.configure("plain", "INFO", stream=stream) == "plain"
        assert (
            sum(isinstance(h, logging.StreamHandler) and h.stream is stream for h in root.handlers)
            == 1
        )
        logging.getLogger("kopf.objects").info(
            "token=abc123 seen", extra={"k8s_ref": {"namespace": "ns", "name": "t"}}
        )
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    line = stream.getvalue().strip()
    assert line.endswith(" INFO kopf.objects: [ns/t] token=*** seen")


def test_a_retried_kopf_handler_failure_is_a_warning_and_its_last_retry_an_error(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    """kopf's own words (kopf/_core/actions/execution.py) for a TemporaryError: retried is
    a WARNING; retried no more, or failed for good, stays an ERROR."""
    _, stream = captured
    kopf_objects = logging.getLogger("kopf.objects")
    handler = "Handler 'notification_created'"
    kopf_objects.error(f"{handler} failed temporarily: Topic ns/t is not Ready yet")
    kopf_objects.error(
        f"{handler} failed temporarily but will exceed 5 retries: Topic ns/t is not Ready yet"
    )
    kopf_objects.error(f"{handler} failed permanently: spec is invalid at: bucket")
    retried, last, permanent = lines(stream)
    assert retried["severity"] == "warning"
    assert last["severity"] == "error" and permanent["severity"] == "error"


@pytest.mark.parametrize("driver", logs.ENDPOINT_DRIVERS)
def test_a_broker_drivers_errors_are_left_to_debug(driver: str) -> None:
    """A driver's ERROR per failed attempt (aiokafka: "Unable connect ...
    SaslAuthenticationFailed" over and over) is not a line at INFO: the endpoint says what
    failed itself. At DEBUG it is there, for whoever digs."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    quiet, loud = io.StringIO(), io.StringIO()
    try:
        logs.configure("json", "INFO", stream=quiet)
        logging.getLogger(f"{driver}.conn").error("Unable connect to node with id 1")
        logs.configure("json", "DEBUG", stream=loud)
        logging.getLogger(f"{driver}.conn").error("Unable connect to node with id 1")
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        logging.getLogger(driver).setLevel(logging.NOTSET)
    assert quiet.getvalue() == ""
    assert [json.loads(line)["severity"] for line in loud.getvalue().splitlines()] == ["error"]


def test_a_request_kopf_sends_again_is_a_warning_and_its_last_attempt_an_error() -> None:
    """kopf's own words (kopf/_cogs/clients/api.py) for a request the API server refused
    with 429 (throttling): tried again is a WARNING, whichever logger kopf used (the
    object's or its client module's); the attempt it gives up on stays an ERROR."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    stream = io.StringIO()
    what = "PATCH https://127.0.0.1:6443/apis/bucketnotify.io/v1alpha1/namespaces/a/topics/t"
    refused = "APITooManyRequestsError('Too many requests, please try again later.', status=429)"
    try:
        logs.configure("json", "INFO", stream=stream)
        logging.getLogger("kopf.objects").error(
            f"Request attempt #1/9 failed; will retry: {what} -> {refused}"
        )
        logging.getLogger("kopf._cogs.clients.api").error(
            f"Request attempt #2/9 failed; will retry: {what} -> {refused}"
        )
        logging.getLogger("kopf.objects").error(
            f"Request attempt #9/9 failed; escalating: {what} -> {refused}"
        )
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    first, second, last = lines(stream)
    assert first["severity"] == second["severity"] == "warning"
    assert last["severity"] == "error"
