"""The demo's pure parts: the samples pointed at this machine, the uploads' expectations
against the samples' own filters, and the arrival check. No services."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import yaml
from demo import arrivals, samples, uploads

from devstack.services import Service

Obj = dict[str, Any]


def load_samples() -> list[Obj]:
    """deploy/samples as its kustomization lists them (kubectl kustomize adds nothing else:
    no namespace, no patches)."""
    kustomization = yaml.safe_load((samples.SAMPLES / "kustomization.yaml").read_text())
    assert set(kustomization) == {"apiVersion", "kind", "resources"}
    objs: list[Obj] = []
    for name in kustomization["resources"]:
        objs += [d for d in yaml.safe_load_all((samples.SAMPLES / name).read_text()) if d]
    return objs


BROKERS = samples.Brokers(
    "http://127.0.0.1:4000/events",
    Service(
        "rabbitmq",
        {"AMQP_HOST": "127.0.0.1", "AMQP_PORT": "15673", "AMQP_USER": "u", "AMQP_PASSWORD": "pw1"},
    ),
    Service(
        "kafka",
        {
            "KAFKA_SASL_BOOTSTRAP": "127.0.0.1:19094",
            "KAFKA_SCRAM_USER": "k",
            "KAFKA_SCRAM_PASSWORD": "pw2",
        },
    ),
)


def local_samples() -> list[Obj]:
    return samples.for_this_machine(load_samples(), BROKERS, "demo-ns")


def by_name(objs: list[Obj], kind: str, name: str) -> Obj:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def test_samples_point_at_the_local_endpoints_and_keep_their_filters() -> None:
    shipped, objs = load_samples(), local_samples()
    assert {o["metadata"]["namespace"] for o in objs} == {"demo-ns"}
    http = by_name(objs, "Topic", samples.HTTP_TOPIC)["spec"]["endpoint"]["http"]
    assert http["url"] == "http://127.0.0.1:4000/events"
    amqp = by_name(objs, "Topic", samples.AMQP_TOPIC)["spec"]["endpoint"]["amqp"]
    assert (amqp["url"], amqp["vhost"]) == ("amqp://127.0.0.1:15673", "/")
    kafka = by_name(objs, "Topic", samples.KAFKA_TOPIC)["spec"]["endpoint"]["kafka"]
    assert kafka["brokers"] == ["127.0.0.1:19094"] and kafka["useSSL"] is False
    assert kafka["sasl"]["mechanism"] == "SCRAM-SHA-512"
    assert by_name(objs, "Secret", "amqp-credentials")["stringData"] == {
        "username": "u",
        "password": "pw1",
    }
    assert by_name(objs, "Secret", "kafka-credentials")["stringData"]["password"] == "pw2"
    notifications = [o for o in objs if o["kind"] == "BucketNotification"]
    assert [n["spec"] for n in notifications] == [
        o["spec"] for o in shipped if o["kind"] == "BucketNotification"
    ]


def test_describing_the_samples_never_prints_a_password() -> None:
    text = "\n".join(samples.describe(o) for o in local_samples())
    assert "pw1" not in text and "pw2" not in text
    assert "secret amqp-credentials" in text


def _matches(notification: Obj, op: uploads.Op) -> bool:
    """The filter semantics of docs/operator.md, for the demo's objects."""
    spec = notification["spec"]
    events = spec.get("events") or ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"]
    family = op.event_name.split(":")[0]
    if f"s3:{op.event_name}" not in events and f"s3:{family}:*" not in events:
        return False
    key = (spec.get("filter") or {}).get("key") or {}
    if not op.key.startswith(key.get("prefix", "")) or not op.key.endswith(key.get("suffix", "")):
        return False
    if "regex" in key and not re.fullmatch(key["regex"], op.key):
        return False
    metadata = {f"x-amz-meta-{k}": v for k, v in op.metadata.items()}
    tags = dict(t.split("=", 1) for t in op.tagging.split("&") if t)
    for rule in (spec.get("filter") or {}).get("metadata") or []:
        if metadata.get(rule["name"]) != rule["value"]:
            return False
    return all(
        tags.get(rule["name"]) == rule["value"]
        for rule in (spec.get("filter") or {}).get("tags") or []
    )


def test_the_uploads_expect_what_the_samples_filters_let_through() -> None:
    """The demo's expectations are derived from the shipped filters, so a change of the
    samples that the demo's objects no longer exercise fails here, not in front of a user."""
    objs = local_samples()
    kind_of = {
        o["metadata"]["name"]: next(iter(o["spec"]["endpoint"]))
        for o in objs
        if o["kind"] == "Topic"
    }
    derived: uploads.Expected = {"http": Counter(), "amqp": Counter(), "kafka": Counter()}
    for op in uploads.OBJECTS:
        for n in objs:
            if n["kind"] == "BucketNotification" and _matches(n, op):
                derived[kind_of[n["spec"]["topicRef"]["name"]]][op.event_name, op.key] += 1
    assert derived == uploads.expected_events()
    # Every notification gets events, and some objects match none.
    assert all(derived.values())
    assert any(not op.endpoints for op in uploads.OBJECTS)


def test_the_check_names_missing_duplicate_and_unexpected_events() -> None:
    expected: uploads.Expected = {
        "http": Counter({("ObjectCreated:Put", "a"): 1, ("ObjectCreated:Put", "b"): 1}),
        "amqp": Counter(),
        "kafka": Counter({("ObjectCreated:Put", "c"): 1}),
    }
    got = {
        "http": Counter({("ObjectCreated:Put", "a"): 2}),
        "amqp": Counter({("ObjectCreated:Put", "x"): 1}),
        "kafka": Counter({("ObjectCreated:Put", "c"): 1}),
    }
    assert arrivals.check(got, expected) == [
        "http: ObjectCreated:Put a arrived 2 times",
        "http: ObjectCreated:Put b did not arrive",
        "amqp: ObjectCreated:Put x arrived, but its filter excludes it",
    ]
    assert arrivals.check(expected, expected) == []
