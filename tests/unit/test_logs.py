"""Log redaction and the JSON/plain formats of bucketnotify.logs."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from bucketnotify import logs


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
    """kubernetes_asyncio logs response bodies at DEBUG, a Secret read before any of its
    values could be remembered included."""
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
