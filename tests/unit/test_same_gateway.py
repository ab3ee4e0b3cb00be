"""Which Topics compete for one ``spec.name``: those on "the same gateway" as far as the
operator can tell without reading Secrets (docs/operator.md, "Gateway topic names"): the
operator's default gateway, or one ``gatewayRef`` Secret (a Secret is of one namespace).

Driven through the operator's own kopf index (``topics_by_gateway_name``) and the lookup its
change handler makes of it (``_claims_of``), then the name decision itself."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from bucketnotify.controller import handlers
from bucketnotify.controller.topic_builder import NameClaim, TopicBuildError, gateway_topic_name
from bucketnotify.controller.topics import parse_spec

HTTP = {"http": {"url": "http://127.0.0.1:9/"}}

# (namespace, name, gatewayRef Secret or None), oldest first; all want spec.name "orders".
TOPICS = [
    ("a", "default-1", None),
    ("b", "default-2", None),
    ("a", "ref-1", "tenant-x"),
    ("a", "ref-2", "tenant-x"),
    ("b", "ref-3", "tenant-x"),  # same Secret name, another namespace: another Secret
    ("a", "ref-4", "tenant-y"),
]


def spec_of(secret: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"endpoint": HTTP, "name": "orders"}
    if secret is not None:
        spec["gatewayRef"] = {"secretName": secret}
    return spec


async def index() -> dict[Any, list[NameClaim]]:
    """The index as kopf holds it: each key with the claims of every Topic giving it."""
    found: dict[Any, list[NameClaim]] = defaultdict(list)
    for minute, (namespace, name, secret) in enumerate(TOPICS):
        entry = await handlers.topics_by_gateway_name(
            namespace=namespace,
            name=name,
            spec=spec_of(secret),
            status={},
            meta={"creationTimestamp": f"2026-01-01T00:{minute:02}:00Z"},
        )
        for key, claim in entry.items():
            found[key].append(claim)
    return found


async def test_topics_compete_for_a_name_only_on_the_default_gateway_or_one_secret() -> None:
    kopf_index = await index()
    rivals = {}
    for namespace, name, secret in TOPICS:
        claims_of = handlers._claims_of(
            {"topics_by_gateway_name": kopf_index}, namespace, spec_of(secret)
        )
        rivals[name] = sorted(f"{c.namespace}/{c.name}" for c in claims_of("orders"))
    assert rivals == {
        "default-1": ["a/default-1", "b/default-2"],
        "default-2": ["a/default-1", "b/default-2"],
        "ref-1": ["a/ref-1", "a/ref-2"],
        "ref-2": ["a/ref-1", "a/ref-2"],
        "ref-3": ["b/ref-3"],
        "ref-4": ["a/ref-4"],
    }

    def decide(namespace: str, name: str, secret: str | None) -> str:
        claims_of = handlers._claims_of(
            {"topics_by_gateway_name": kopf_index}, namespace, spec_of(secret)
        )
        created = next(
            c.created for c in claims_of("orders") if (c.namespace, c.name) == (namespace, name)
        )
        return gateway_topic_name(
            namespace, name, parse_spec(spec_of(secret)), None, created, claims_of
        )

    # The oldest of each gateway gets the name; the younger one on the same gateway is
    # refused naming it; a Topic alone on its gateway gets it too.
    for namespace, name, secret in (TOPICS[0], TOPICS[2], TOPICS[4], TOPICS[5]):
        assert decide(namespace, name, secret) == "orders", name
    for (namespace, name, secret), owner in ((TOPICS[1], "a/default-1"), (TOPICS[3], "a/ref-1")):
        with pytest.raises(TopicBuildError) as refused:
            decide(namespace, name, secret)
        assert refused.value.reason == "NameConflict"
        assert f"belongs to Topic {owner}" in str(refused.value)
