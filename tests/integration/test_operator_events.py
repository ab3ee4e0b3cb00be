"""The operator's Kubernetes Events on Topics, and its JSON logs without secrets.

The operator runs as a real process (JSON logs at DEBUG, its most talkative) against the
real apiserver and gateway; the gateway is taken away and brought back with a TCP proxy.
"""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import urlsplit

import pytest

from devstack.servers.tcpproxy import TcpProxy
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.operator import StartOperator
from tests.resources import apply, condition, credentials_secret, object_events
from tests.s3 import s3_client
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")


def reasons(events: list[dict[str, Any]]) -> list[str]:
    return [e["reason"] for e in events]


def occurrences(events: list[dict[str, Any]], reason: str) -> int:
    """How often ``reason`` was said: a repeat raises its Event's count."""
    return sum(e.get("count") or 1 for e in events if e["reason"] == reason)


def test_failure_once_then_recovered_created_updated_and_no_secret_in_events_or_logs(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator, rgw: LocalService
) -> None:
    """A Topic whose gateway is away gets one Warning saying so, not one per retry; when the
    gateway returns: Recovered and Created; a spec change: Updated. The operator's JSON log
    and the Events never show the gateway secret key or a broker password."""
    operator = start_operator(log_format="json", log_level="DEBUG")
    password = "pa55-w0rd-of-the-broker"
    credentials_secret(kubectl, namespace, "broker", "alice", password)
    target = urlsplit(rgw["RGW_ENDPOINT"])
    assert target.hostname is not None and target.port is not None
    proxy = TcpProxy(target.hostname, target.port)
    kubectl.run(
        "create",
        "secret",
        "generic",
        "gw",
        "-n",
        namespace,
        f"--from-literal=endpoint={proxy.url}",
        f"--from-literal=accessKey={rgw['RGW_ACCESS_KEY']}",
        f"--from-literal=secretKey={rgw['RGW_SECRET_KEY']}",
    )
    spec: dict[str, Any] = {
        "endpoint": {
            "amqp": {
                "url": "amqp://127.0.0.1:9",
                "exchange": "ex",
                "credentialsRef": {"secretName": "broker"},
            }
        },
        "gatewayRef": {"secretName": "gw"},
    }
    apply(kubectl, namespace, "Topic", "far", spec)
    condition(kubectl, namespace, "topic", "far", status="False", reason="CleartextCredentials")
    # Allowed cleartext is not ours to decide per Topic: use plain HTTP, which needs no
    # credentials, and let the gateway be unreachable.
    spec["endpoint"] = {"http": {"url": "http://127.0.0.1:9/far"}}
    apply(kubectl, namespace, "Topic", "far", spec)
    condition(kubectl, namespace, "topic", "far", status="False", reason="GatewayUnreachable")
    # kopf retries every 15 s: wait for a retry that found the same failure.
    wait_until(
        operator.log,
        lambda log: log.count("failed temporarily") >= 2,
        60,
        "a retry of the failing change",
    )
    failing = object_events(kubectl, namespace, "Topic", "far")
    assert reasons(failing).count("GatewayUnreachable") == 1, reasons(failing)
    unreachable = failing[reasons(failing).index("GatewayUnreachable")]
    assert unreachable["type"] == "Warning"

    succeeded = "Handler 'topic_changed' succeeded"
    succeeded_before = operator.log().count(succeeded)
    proxy.start()
    try:
        condition(kubectl, namespace, "topic", "far")
        synced = wait_until(
            lambda: object_events(kubectl, namespace, "Topic", "far"),
            lambda ev: {"Recovered", "Created"} <= set(reasons(ev)),
            30,
            "Recovered and Created",
        )
        recovered = synced[reasons(synced).index("Recovered")]
        assert recovered["type"] == "Normal"
        assert "GatewayUnreachable" in recovered["message"]
        # kopf's retry of the failed change may still come (and say Updated): let it.
        wait_until(
            lambda: operator.log().count(succeeded),
            lambda count: count > succeeded_before,
            40,
            "the retry of the failed change to succeed",
        )
        updates = occurrences(object_events(kubectl, namespace, "Topic", "far"), "Updated")
        spec["endpoint"] = {"http": {"url": "http://127.0.0.1:9/elsewhere"}}
        apply(kubectl, namespace, "Topic", "far", spec)
        # A repeated Event's count is patched at most every 30 s.
        updated = wait_until(
            lambda: object_events(kubectl, namespace, "Topic", "far"),
            lambda ev: occurrences(ev, "Updated") == updates + 1,
            60,
            "Updated after the spec change",
        )
        assert reasons(updated).count("Updated") == 1, "one Event per reason, counting up"
    finally:
        proxy.stop()
    operator.stop()

    every_event = json.dumps(object_events(kubectl, namespace, "Topic", "far"))
    logged = operator.log()
    for secret in (password, rgw["RGW_SECRET_KEY"]):
        for form in (secret, base64.b64encode(secret.encode()).decode()):
            assert form not in every_event
            assert form not in logged
    records = [json.loads(line) for line in logged.splitlines() if line.strip()]
    assert all({"timestamp", "severity", "logger", "message"} <= set(r) for r in records)
    about_far = [r for r in records if (r.get("object") or {}).get("name") == "far"]
    assert about_far and all(r["object"]["kind"] == "Topic" for r in about_far)
    assert any(r["severity"] == "debug" for r in records), "DEBUG records were written"


def test_a_test_event_that_cannot_be_sent_warns_and_deletions_are_told(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator, rgw: LocalService
) -> None:
    """TestEventNotSent (Warning) when the Topic's endpoint refuses the s3:TestEvent, and
    for AMQP, Kafka and persistent Topics, which the operator cannot send one to; the
    notification Ready all the same; Deleted (Normal) on each object once the gateway no
    longer has it."""
    start_operator(ingest_url="http://127.0.0.1:9")  # nothing reaches the ingest here
    bucket = f"ev-{namespace}"
    s3_client(rgw).create_bucket(Bucket=bucket)
    # Port 9 (discard) refuses on loopback: the test event cannot be posted.
    apply(
        kubectl, namespace, "Topic", "hook", {"endpoint": {"http": {"url": "http://127.0.0.1:9/"}}}
    )
    condition(kubectl, namespace, "topic", "hook")
    apply(
        kubectl,
        namespace,
        "BucketNotification",
        "n",
        {"bucket": bucket, "topicRef": {"name": "hook"}},
    )
    status = condition(kubectl, namespace, "bucketnotification", "n")
    assert status.get("testEventSent") is False
    (warning,) = [
        e
        for e in object_events(kubectl, namespace, "BucketNotification", "n")
        if e["reason"] == "TestEventNotSent"
    ]
    assert warning["type"] == "Warning"
    assert warning["message"].startswith("could not connect to http://127.0.0.1:9")

    # The brokers' addresses are never dialled: no object is uploaded.
    unreachable = {
        "mq": {"amqp": {"url": "amqp://127.0.0.1:9", "exchange": "x", "ackLevel": "none"}},
        "log": {"kafka": {"url": "kafka://127.0.0.1:9", "ackLevel": "none"}},
        "queued": {"http": {"url": "http://127.0.0.1:9/q"}},
    }
    for topic, endpoint in unreachable.items():
        spec = {"endpoint": endpoint, "persistent": topic == "queued"}
        apply(kubectl, namespace, "Topic", topic, spec)
        condition(kubectl, namespace, "topic", topic)
        apply(
            kubectl, namespace, "BucketNotification", f"to-{topic}",
            {"bucket": bucket, "topicRef": {"name": topic}},
        )  # fmt: skip
    for topic in unreachable:
        status = condition(kubectl, namespace, "bucketnotification", f"to-{topic}")
        assert status.get("testEventSent") is False, topic
        (not_sent,) = [
            e
            for e in object_events(kubectl, namespace, "BucketNotification", f"to-{topic}")
            if e["reason"] == "TestEventNotSent"
        ]
        assert not_sent["type"] == "Warning", topic
        assert not_sent["message"] == "test events reach only non-persistent HTTP topics for now"

    kubectl.run("delete", "bucketnotification", "n", "-n", namespace, "--timeout=60s")
    kubectl.run("delete", "topic", "hook", "-n", namespace, "--timeout=60s")
    for kind, name in (("BucketNotification", "n"), ("Topic", "hook")):
        deleted = [
            e for e in object_events(kubectl, namespace, kind, name) if e["reason"] == "Deleted"
        ]
        assert [e["type"] for e in deleted] == ["Normal"], (kind, deleted)
