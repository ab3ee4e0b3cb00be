"""Which gateway topic name a Topic gets (issue: Topics ``a/orders`` and ``b/orders`` shared
one gateway topic, because gateway topics belong to a tenant, not a namespace)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bucketnotify.api.topic import TopicSpec
from bucketnotify.controller.topic_builder import (
    GATEWAY_TOPIC_NAME,
    NameClaim,
    TopicBuildError,
    check_gateway_name,
    default_gateway_topic_name,
    gateway_topic_name,
    name_owner,
)
from bucketnotify.gateway.release import GatewayRelease

SPEC = TopicSpec.model_validate({"endpoint": {"http": {"url": "http://h/"}}})
NAMED = TopicSpec.model_validate({"endpoint": {"http": {"url": "http://h/"}}, "name": "orders"})
ARN = "arn:aws:sns:default::"

# Kubernetes names: a namespace is a DNS label, an object name a DNS subdomain.
labels = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?\Z")
subdomains = st.lists(labels, min_size=1, max_size=3).map(".".join)


@given(labels, subdomains, labels, subdomains)
def test_default_names_of_different_topics_never_collide(
    ns_a: str, name_a: str, ns_b: str, name_b: str
) -> None:
    same_topic = (ns_a, name_a) == (ns_b, name_b)
    same_name = default_gateway_topic_name(ns_a, name_a) == default_gateway_topic_name(ns_b, name_b)
    assert same_topic == same_name


def test_a_new_topic_gets_a_namespace_qualified_name() -> None:
    assert gateway_topic_name("a", "orders", SPEC, None, "t1", lambda _: []) == "a_orders"


@given(labels, subdomains)
def test_default_names_are_names_every_gateway_release_takes(namespace: str, name: str) -> None:
    """Ceph 19+ refuses a topic name with a dot (CreateTopic InvalidArgument), which every
    Topic got by default before: no Topic became Ready on a current gateway."""
    assert GATEWAY_TOPIC_NAME.fullmatch(default_gateway_topic_name(namespace, name))


def test_the_longest_kubernetes_names_still_make_distinct_names_the_gateway_takes() -> None:
    namespace = "n" * 63
    names = ["a" * 63 + "." + "b" * 63 + "." + "c" * 63 + "." + "d" * 61, "a" * 253]
    made = {default_gateway_topic_name(namespace, name) for name in names}
    assert len(made) == 2
    for gateway_name in made:
        assert GATEWAY_TOPIC_NAME.fullmatch(gateway_name), gateway_name
        assert gateway_name.startswith(f"{namespace}_aaaa")


def test_dots_of_a_name_become_underscores() -> None:
    assert default_gateway_topic_name("team-a", "orders.v2") == "team-a_orders_v2"


def test_a_topic_of_an_older_release_keeps_its_bare_gateway_name() -> None:
    """Upgrade: renaming would orphan the gateway topic and change the routing key."""
    mine = NameClaim("a", "orders", "t1", holds=True)
    table = {"orders": [mine]}
    name = gateway_topic_name("a", "orders", SPEC, f"{ARN}orders", "t1", lambda n: table.get(n, []))
    assert name == "orders"


def test_of_two_old_topics_sharing_a_bare_name_the_younger_moves_to_its_own() -> None:
    older = NameClaim("a", "orders", "2024-01-01T00:00:00Z", holds=True)
    younger = NameClaim("b", "orders", "2025-01-01T00:00:00Z", holds=True)
    table = {"orders": [older, younger]}

    def claims_of(name: str) -> list[NameClaim]:
        return table.get(name, [])

    assert gateway_topic_name("a", "orders", SPEC, f"{ARN}orders", older.created, claims_of) == (
        "orders"
    )
    assert gateway_topic_name("b", "orders", SPEC, f"{ARN}orders", younger.created, claims_of) == (
        "b_orders"
    )


def test_an_explicit_name_another_topic_holds_is_refused_naming_the_holder() -> None:
    holder = NameClaim("a", "first", "2025-06-01T00:00:00Z", holds=True)
    # Even an older Topic does not take a name that another one already holds.
    with pytest.raises(TopicBuildError) as refused:
        gateway_topic_name("b", "second", NAMED, None, "2020-01-01T00:00:00Z", lambda n: [holder])
    assert refused.value.reason == "NameConflict"
    assert "'orders' belongs to Topic a/first" in str(refused.value)
    assert "set spec.name" in str(refused.value)


def test_an_explicit_name_nobody_holds_goes_to_the_oldest_claimant() -> None:
    older = NameClaim("a", "first", "2025-01-01T00:00:00Z", holds=False)
    younger = NameClaim("b", "second", "2025-02-01T00:00:00Z", holds=False)

    def claims_of(name: str) -> list[NameClaim]:
        return [older, younger]

    assert gateway_topic_name("a", "first", NAMED, None, older.created, claims_of) == "orders"
    with pytest.raises(TopicBuildError):
        gateway_topic_name("b", "second", NAMED, None, younger.created, claims_of)


claim = st.builds(
    NameClaim,
    namespace=labels,
    name=subdomains,
    created=st.sampled_from(["2025-01-01T00:00:00Z", "2025-01-02T00:00:00Z"]),
    holds=st.booleans(),
)


@given(st.lists(claim, min_size=1, max_size=6, unique_by=lambda c: (c.namespace, c.name)))
def test_every_claimant_agrees_on_one_owner_whatever_the_order(found: list[NameClaim]) -> None:
    """Replicas and retries see the index in any order: the decision must not depend on it."""
    owner = name_owner(found)
    assert name_owner(list(reversed(found))) == owner
    assert name_owner(sorted(found, key=lambda c: c.name)) == owner
    if any(c.holds for c in found):
        assert owner.holds, "a Topic holding the name keeps it"


def test_a_spec_name_the_gateways_release_refuses_is_refused_with_its_rule() -> None:
    """Ceph 19+ answers CreateTopic of a dotted name with 400 InvalidArgument: the operator
    says why without asking, and only where the release refuses it."""
    tentacle = GatewayRelease("tentacle", "server-header")
    with pytest.raises(TopicBuildError) as refused:
        check_gateway_name("orders.v2", tentacle)
    assert refused.value.reason == "InvalidSpec"
    assert "this gateway (Ceph tentacle) takes only letters, digits, '_' and '-'" in str(
        refused.value
    )
    with pytest.raises(TopicBuildError):
        check_gateway_name("o" * 257, tentacle)
    check_gateway_name("o" * 256, tentacle)
    check_gateway_name("orders_v2-x", tentacle)
    for taking in (GatewayRelease("reef", "admin-info"), GatewayRelease("pacific", "admin-info")):
        check_gateway_name("orders.v2", taking)
    check_gateway_name("orders.v2", None)
