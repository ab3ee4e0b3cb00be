"""A BucketNotification on the bucket of an ObjectBucketClaim (``bucketRef``), with claims,
ConfigMaps and Secrets shaped as Rook's bucket provisioner makes them, on the real apiserver
and gateway. The provisioner's part (bucket, owner, binding, deletion) is played by the test:
Rook's operator cannot run here."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from bucketnotify.gateway.notifications import NotificationClient
from devstack.servers.recording import HttpReceiver
from tests.claims import Provisioner, install_claim_crd
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.processes import Program
from tests.resources import apply, condition, rook_user_secret
from tests.s3 import connection

pytestmark = pytest.mark.usefixtures("crds", "claim_crd")


@pytest.fixture(scope="session")
def claim_crd(kubectl: Kubectl) -> None:
    install_claim_crd(kubectl)


@pytest.fixture()
def receiver() -> Iterator[HttpReceiver]:
    with HttpReceiver() as r:
        yield r


@pytest.fixture()
def owner(rgw: LocalService) -> Any:
    """S3 as the claim's bucket owner (the user the provisioner made for it)."""
    return connection(rgw, other=True).s3()


@pytest.fixture()
def provisioner(kubectl: Kubectl, namespace: str, rgw: LocalService, owner: Any) -> Provisioner:
    return Provisioner(kubectl, namespace, rgw, owner)


def hook(kubectl: Kubectl, namespace: str, receiver: HttpReceiver, **spec: Any) -> None:
    apply(
        kubectl, namespace, "Topic", "hook", {"endpoint": {"http": {"url": receiver.url}}, **spec}
    )
    condition(kubectl, namespace, "topic", "hook")


def on_claim(kubectl: Kubectl, namespace: str, name: str, claim: str) -> None:
    apply(
        kubectl,
        namespace,
        "BucketNotification",
        name,
        {
            "bucketRef": {"objectBucketClaim": claim},
            "topicRef": {"name": "hook"},
            "testEvent": False,
        },
    )


def test_a_notification_follows_its_claim_until_bound_and_is_written_with_the_owners_keys(
    kubectl: Kubectl,
    namespace: str,
    operator: Program,
    receiver: HttpReceiver,
    provisioner: Provisioner,
    owner: Any,
    rgw: LocalService,
) -> None:
    """Made before its claim, the notification waits (claim not found, then not bound);
    once the claim is bound its Id is on the claim's bucket, written with the claim's keys
    (the operator's own gateway user does not own that bucket), the bucket shows in the
    status, and an upload's event arrives. Deleting the notification takes its Id off with
    the claim's keys again. Its Topic reaches the gateway through a CephObjectStoreUser's
    Secret as Rook makes it: Rook's two objects drive the whole way to a delivered event."""
    hook(
        kubectl,
        namespace,
        receiver,
        gatewayRef={
            "secretName": rook_user_secret(
                kubectl,
                namespace,
                rgw["RGW_ENDPOINT"],
                rgw["RGW_ACCESS_KEY"],
                rgw["RGW_SECRET_KEY"],
            )
        },
    )
    on_claim(kubectl, namespace, "uploads", "photos")
    status = condition(
        kubectl, namespace, "bucketnotification", "uploads", "False", "BucketClaimNotFound"
    )
    assert f"ObjectBucketClaim {namespace}/photos" in status["conditions"][0]["message"]
    provisioner.claim("photos")
    condition(kubectl, namespace, "bucketnotification", "uploads", "False", "BucketClaimNotBound")
    bucket = provisioner.bind("photos")
    status = condition(kubectl, namespace, "bucketnotification", "uploads")
    assert status["bucket"] == bucket
    assert status["applied"]["bucket"] == bucket
    assert provisioner.ids(bucket) == ["uploads"]
    row = kubectl.run("get", "bucketnotification", "uploads", "-n", namespace).stdout
    assert bucket in row, row

    owner.put_object(Bucket=bucket, Key="cat.jpg", Body=b"meow")
    (record,) = receiver.next_records()
    assert (record["s3"]["bucket"]["name"], record["s3"]["object"]["key"]) == (bucket, "cat.jpg")
    assert record["s3"]["configurationId"] == "uploads"

    kubectl.run("delete", "bucketnotification", "uploads", "-n", namespace, "--wait=true")
    assert provisioner.ids(bucket) == []
    owner.delete_object(Bucket=bucket, Key="cat.jpg")
    owner.delete_bucket(Bucket=bucket)


def test_the_schema_refuses_a_bucket_twice_or_a_gateway_beside_a_claim(
    kubectl: Kubectl, namespace: str
) -> None:
    both = {
        "bucket": "b-1",
        "bucketRef": {"objectBucketClaim": "photos"},
        "topicRef": {"name": "x"},
    }
    gateway = {
        "bucketRef": {"objectBucketClaim": "photos"},
        "gatewayRef": {"secretName": "gw"},
        "topicRef": {"name": "x"},
    }
    for spec, words in (
        (both, "set exactly one of bucket"),
        (gateway, "leave gatewayRef out"),
    ):
        refused = kubectl.apply(
            {
                "apiVersion": "bucketnotify.io/v1alpha1",
                "kind": "BucketNotification",
                "metadata": {"name": "refused", "namespace": namespace},
                "spec": spec,
            },
            check=False,
        )
        assert refused.returncode != 0 and words in refused.stderr, refused.stderr
    apply(
        kubectl, namespace, "BucketNotification", "kept",
        {"bucketRef": {"objectBucketClaim": "photos"}, "topicRef": {"name": "x"}},
    )  # fmt: skip
    moved = kubectl.run(
        "patch", "bucketnotification", "kept", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"bucketRef": {"objectBucketClaim": "other"}}}), check=False,
    )  # fmt: skip
    assert moved.returncode != 0 and "immutable" in moved.stderr, moved.stderr


@pytest.mark.parametrize("reclaim", ["Delete", "Retain"])
def test_a_deleted_claim_makes_its_notification_not_ready_and_its_id_leaves_the_bucket(
    kubectl: Kubectl,
    namespace: str,
    operator: Program,
    receiver: HttpReceiver,
    provisioner: Provisioner,
    rgw: LocalService,
    owner: Any,
    reclaim: str,
) -> None:
    """The claim deleted under a Ready notification: Ready=False (BucketClaimNotFound) at
    once. With reclaim policy Delete the bucket took the Id along and the status no longer
    holds it applied. With Retain the bucket stays and only its owner may change it, whose
    keys went with the claim: the message names the Id left and the request that removes
    it, and deleting the notification does not wait for what nobody can do."""
    hook(kubectl, namespace, receiver)
    provisioner.claim("photos")
    bucket = provisioner.bind("photos")
    on_claim(kubectl, namespace, "uploads", "photos")
    condition(kubectl, namespace, "bucketnotification", "uploads")
    assert provisioner.ids(bucket) == ["uploads"]

    provisioner.delete("photos", bucket, reclaim)
    status = condition(
        kubectl, namespace, "bucketnotification", "uploads", "False", "BucketClaimNotFound"
    )
    message = status["conditions"][0]["message"]
    if reclaim == "Delete":
        assert f"bucket {bucket} is gone, and Id uploads with it" in message, message
        assert "applied" not in status
        return
    assert f"Id uploads stays on bucket {bucket}" in message, message
    assert f"DELETE /{bucket}?notification=uploads" in message, message
    assert status["applied"]["bucket"] == bucket
    kubectl.run("delete", "bucketnotification", "uploads", "-n", namespace, "--timeout=30s")
    assert provisioner.ids(bucket) == ["uploads"]
    # What the message says to do (boto3 has no request that removes one Id).
    with NotificationClient(connection(rgw, other=True)) as by_hand:
        by_hand.delete(bucket, "uploads")
    assert provisioner.ids(bucket) == []
    owner.delete_bucket(Bucket=bucket)


def test_a_kept_bucket_that_lets_the_topics_gateway_user_in_loses_the_id_with_its_claim(
    kubectl: Kubectl,
    namespace: str,
    operator: Program,
    receiver: HttpReceiver,
    provisioner: Provisioner,
    rgw: LocalService,
    owner: Any,
) -> None:
    """Reclaim policy Retain, but the owner's bucket policy lets the Topic's gateway user
    read and change the bucket's notifications: once the claim and its keys are gone, the
    operator removes the Id itself with that user's keys, and the status lets go of it.
    (Without such a policy the Id stays: the Retain case of the test above.)"""
    hook(kubectl, namespace, receiver)
    provisioner.claim("photos")
    bucket = provisioner.bind("photos")
    topic_user = f"arn:aws:iam:::user/{rgw['RGW_USER']}"
    owner.put_bucket_policy(
        Bucket=bucket,
        Policy=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Principal": {"AWS": [topic_user]},
                        "Action": ["s3:GetBucketNotification", "s3:PutBucketNotification"],
                        "Resource": [f"arn:aws:s3:::{bucket}"],
                    }
                ],
            }
        ),
    )
    on_claim(kubectl, namespace, "uploads", "photos")
    condition(kubectl, namespace, "bucketnotification", "uploads")
    assert provisioner.ids(bucket) == ["uploads"]

    provisioner.delete("photos", bucket, "Retain")
    status = condition(
        kubectl, namespace, "bucketnotification", "uploads", "False", "BucketClaimNotFound"
    )
    message = status["conditions"][0]["message"]
    assert f"Id uploads removed from bucket {bucket}" in message, message
    assert "applied" not in status
    assert provisioner.ids(bucket) == []
    kubectl.run("delete", "bucketnotification", "uploads", "-n", namespace, "--timeout=30s")
    owner.delete_bucket(Bucket=bucket)
