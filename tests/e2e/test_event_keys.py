"""Every object key the gateway accepts reaches every endpoint kind once, intact.

S3 keys may hold any UTF-8 character, control characters included, and the gateway notifies
for all of them. A key used to go raw into the ``ce-subject`` header of CloudEvents pushes;
the HTTP client refused the request and the event was dropped as undeliverable. Real
everything: operator and a delivery replica as processes, the gateway, RabbitMQ, Kafka.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devstack.servers.recording import RecordingHttpServer
from tests.faults.pipeline import AmqpTarget, HttpTarget, KafkaTarget, Pipeline, Target
from tests.localservices import LocalService
from tests.s3 import s3_client

pytestmark = pytest.mark.usefixtures("crds")

# The longest key the test gateway stores: 1024 bytes of UTF-8, as in S3 (a longer one is
# refused with 400 InvalidObjectName, checked below).
LONGEST = 1024

KEYS = {
    "newline": "nl\nkey.txt",
    "tab": "tab\tkey.txt",
    "percent": "100%/done%20.txt",
    "quote": 'say "cheese".txt',
    "non-ascii": "dïr/ünïcødé/日本語.txt",
    "longest": "l/" + "é" * ((LONGEST - 2) // 2),
}


class CloudEventsTarget(HttpTarget):
    """HTTP with cloudEvents: also checks each push's ce-subject decodes to the record's key."""

    def __init__(self, receiver: RecordingHttpServer) -> None:
        super().__init__(receiver)
        self._receiver_ce = receiver
        self.subjects: list[tuple[str, str]] = []

    def endpoint(self, topic: str) -> dict[str, Any]:
        spec = super().endpoint(topic)
        spec["endpoint"]["http"]["cloudEvents"] = True
        return spec

    def keys(self, topic: str) -> list[str]:
        for request in self._receiver_ce.received():
            (record,) = json.loads(request.body)["Records"]
            self.subjects.append(
                (record["s3"]["object"]["key"], request.header("ce-subject") or "")
            )
            self._seen[request.path.strip("/")].append(record["s3"]["object"]["key"])
        return list(self._seen[topic])


@pytest.fixture()
def pipeline(kube: LocalService, rgw: LocalService) -> Iterator[Pipeline]:
    made = Pipeline(kube, rgw, replicas=1)
    yield made
    made.close()


def test_the_gateway_stores_keys_up_to_1024_bytes(rgw: LocalService) -> None:
    """The bound the longest key below relies on."""
    s3 = s3_client(rgw)
    bucket = f"keys-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key=KEYS["longest"], Body=b"x")
    assert len(KEYS["longest"].encode()) == LONGEST
    with pytest.raises(s3.exceptions.ClientError, match="InvalidObjectName"):
        s3.put_object(Bucket=bucket, Key=KEYS["longest"] + "x", Body=b"x")


def test_every_key_reaches_every_endpoint_kind_once_and_intact(
    pipeline: Pipeline, rabbitmq: LocalService, kafka: LocalService
) -> None:
    with RecordingHttpServer() as plain, RecordingHttpServer() as cloud_events:
        ce_target = CloudEventsTarget(cloud_events)
        targets: dict[str, Target] = {
            "http": HttpTarget(plain),
            "http-cloudevents": ce_target,
            "amqp": AmqpTarget(rabbitmq),
            "kafka": KafkaTarget(kafka["KAFKA_BOOTSTRAP"]),
        }
        buckets = {kind: pipeline.topics(target, ("sync",)) for kind, target in targets.items()}
        s3 = s3_client(pipeline.rgw)
        for topic_buckets in buckets.values():
            for bucket in topic_buckets.values():
                for key in KEYS.values():
                    s3.put_object(Bucket=bucket, Key=key, Body=b"k")

        expected = sorted(KEYS.values())
        got: dict[str, list[str]] = {}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            got = {
                kind: sorted(k for topic in buckets[kind] for k in targets[kind].keys(topic))
                for kind in targets
            }
            if all(len(keys) >= len(expected) for keys in got.values()):
                break
            time.sleep(1)
        time.sleep(3)  # stragglers: a second copy would arrive now
        got = {
            kind: sorted(k for topic in buckets[kind] for k in targets[kind].keys(topic))
            for kind in targets
        }

    log = pipeline.cluster.replicas["replica-0"].log()
    for kind in targets:
        assert got[kind] == expected, f"{kind}: every key once, byte for byte"
    # CloudEvents HTTP binding: a header value is printable ASCII without space or '"', and
    # percent-decodes (UTF-8) to the attribute.
    assert sorted(key for key, _ in ce_target.subjects) == expected
    for key, subject in ce_target.subjects:
        assert all("!" <= c <= "~" and c != '"' for c in subject), subject
        assert urllib.parse.unquote(subject, errors="strict") == key
    assert "event lost" not in log and "could not form" not in log
