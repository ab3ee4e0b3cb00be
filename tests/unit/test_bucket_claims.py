"""Reading a bound ObjectBucketClaim's ConfigMap and Secret into a bucket and a connection."""

from __future__ import annotations

import pytest

from bucketnotify.api.common import NotReconcilable
from bucketnotify.api.notification import BucketRef
from bucketnotify.controller.bucket_claims import claimed_from
from bucketnotify.gateway.connection import same_endpoint

WHERE = "ObjectBucketClaim shop/photos"
KEYS = {"AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "s3cr3t"}


def config(**more: str) -> dict[str, str]:
    """A ConfigMap as Rook's provisioner writes it for a store's plain HTTP port."""
    return {
        "BUCKET_HOST": "rook-ceph-rgw-store.rook-ceph.svc",
        "BUCKET_PORT": "80",
        "BUCKET_NAME": "photos-4f2a",
        "BUCKET_REGION": "us-east-1",
        "BUCKET_SUBREGION": "",
        **more,
    }


def test_the_bucket_gateway_and_owner_keys_come_from_the_claims_configmap_and_secret() -> None:
    claimed = claimed_from(WHERE, BucketRef(object_bucket_claim="photos"), config(), KEYS)
    assert claimed.bucket == "photos-4f2a"
    assert claimed.connection.endpoint == "http://rook-ceph-rgw-store.rook-ceph.svc:80"
    assert (claimed.connection.access_key, claimed.connection.secret_key) == ("AKIA1", "s3cr3t")
    assert (claimed.connection.region, claimed.connection.kind) == ("us-east-1", "ceph")
    assert "s3cr3t" not in repr(claimed)


@pytest.mark.parametrize(
    ("port", "scheme", "endpoint"),
    [
        ("443", None, "https://h:443"),
        ("8443", None, "http://h:8443"),
        ("8443", "https", "https://h:8443"),
        ("443", "http", "http://h:443"),
    ],
)
def test_the_scheme_is_https_on_443_unless_the_ref_says(
    port: str, scheme: str | None, endpoint: str
) -> None:
    ref = BucketRef.model_validate({"objectBucketClaim": "photos", "scheme": scheme})
    claimed = claimed_from(WHERE, ref, config(BUCKET_HOST="h", BUCKET_PORT=port), KEYS)
    assert claimed.connection.endpoint == endpoint


def test_an_ipv6_host_is_bracketed_and_a_missing_region_is_the_default() -> None:
    claimed = claimed_from(
        WHERE,
        BucketRef(object_bucket_claim="p"),
        config(BUCKET_HOST="fd00::5", BUCKET_REGION=""),
        KEYS,
    )
    assert claimed.connection.endpoint == "http://[fd00::5]:80"
    assert claimed.connection.region == "default"


@pytest.mark.parametrize(
    ("cm", "keys", "words"),
    [
        (config(BUCKET_NAME=""), KEYS, "lack BUCKET_NAME"),
        ({}, {}, "lack BUCKET_NAME, BUCKET_HOST, BUCKET_PORT, AWS_ACCESS_KEY_ID, AWS_SECRET"),
        (config(), {"AWS_ACCESS_KEY_ID": "AKIA1"}, "lack AWS_SECRET_ACCESS_KEY"),
        (config(BUCKET_PORT="http"), KEYS, "BUCKET_PORT 'http' is not a port number"),
        (config(BUCKET_PORT="70000"), KEYS, "BUCKET_PORT '70000' is not a port number"),
    ],
)
def test_a_claim_that_lacks_what_rook_writes_says_what(
    cm: dict[str, str], keys: dict[str, str], words: str
) -> None:
    with pytest.raises(NotReconcilable) as refused:
        claimed_from(WHERE, BucketRef(object_bucket_claim="photos"), cm, keys)
    assert refused.value.reason == "InvalidBucketClaim"
    assert words in str(refused.value) and WHERE in str(refused.value)
    assert "s3cr3t" not in str(refused.value)


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        (
            "http://rook-ceph-rgw-store.rook-ceph.svc:80",
            "http://rook-ceph-rgw-store.rook-ceph.svc",
            True,
        ),
        ("https://GW.example:443/", "https://gw.example", True),
        ("http://gw:8080", "http://gw:80", False),
        ("http://gw", "https://gw", False),
        ("http://gw/a", "http://gw/b", False),
    ],
)
def test_a_claims_gateway_is_the_same_as_one_written_without_its_default_port(
    a: str, b: str, same: bool
) -> None:
    """The Id-owner rule compares gateways: a claim's BUCKET_HOST:BUCKET_PORT always names
    the port, a Topic's gatewayRef seldom does."""
    assert same_endpoint(a, b) is same
