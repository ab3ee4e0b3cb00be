"""ObjectBucketClaims as Rook's bucket provisioner makes and binds them, played by hand (Rook's
operator cannot run here): the claim, its bucket owned by the gateway's second user, the
ConfigMap and Secret named as the claim, the binding and the deletion."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.kubectl import Kubectl
from tests.localservices import LocalService

CLAIM_CRD = Path(__file__).parent / "data" / "objectbucketclaims.objectbucket.io.yaml"
PROVISIONER = "rook-ceph.ceph.rook.io-bucket"


def install_claim_crd(kubectl: Kubectl) -> None:
    kubectl.apply_path(CLAIM_CRD)
    kubectl.run(
        "wait", "--for=condition=Established", "--timeout=60s",
        "crd/objectbucketclaims.objectbucket.io",
    )  # fmt: skip


class Provisioner:
    """What Rook's bucket provisioner does with a claim, done by hand."""

    def __init__(self, kubectl: Kubectl, namespace: str, rgw: LocalService, owner: Any) -> None:
        self.kubectl, self.namespace, self.rgw, self.owner = kubectl, namespace, rgw, owner

    def claim(self, name: str) -> None:
        """A new claim, Pending until ``bind``."""
        self.kubectl.apply(
            {
                "apiVersion": "objectbucket.io/v1alpha1",
                "kind": "ObjectBucketClaim",
                "metadata": {"name": name, "namespace": self.namespace},
                "spec": {"generateBucketName": name, "storageClassName": "rook-ceph-bucket"},
            }
        )
        self._status(name, "Pending")

    def bind(self, name: str) -> str:
        """A bucket of the claim's own user, the ConfigMap and Secret named as the claim
        (owned by it), then the claim Bound; the bucket's name."""
        bucket = f"{name}-{uuid.uuid4().hex[:8]}"
        self.owner.create_bucket(Bucket=bucket)
        claim = self.kubectl.get("objectbucketclaim", name, self.namespace)
        meta = {
            "name": name,
            "namespace": self.namespace,
            "labels": {"bucket-provisioner": PROVISIONER},
            "ownerReferences": [
                {
                    "apiVersion": "objectbucket.io/v1alpha1",
                    "kind": "ObjectBucketClaim",
                    "name": name,
                    "uid": claim["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        }
        gateway = urlsplit(self.rgw["RGW_ENDPOINT"])
        self.kubectl.apply(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": meta,
                "data": {
                    "BUCKET_HOST": str(gateway.hostname),
                    "BUCKET_PORT": str(gateway.port),
                    "BUCKET_NAME": bucket,
                    "BUCKET_REGION": "us-east-1",
                    "BUCKET_SUBREGION": "",
                },
            }
        )
        self.kubectl.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": meta,
                "stringData": {
                    "AWS_ACCESS_KEY_ID": self.rgw["RGW_OTHER_ACCESS_KEY"],
                    "AWS_SECRET_ACCESS_KEY": self.rgw["RGW_OTHER_SECRET_KEY"],
                },
            }
        )
        patch = {"spec": {"bucketName": bucket, "objectBucketName": f"obc-{self.namespace}-{name}"}}
        self.kubectl.run(
            "patch", "objectbucketclaim", name, "-n", self.namespace, "--type=merge",
            "-p", json.dumps(patch),
        )  # fmt: skip
        self._status(name, "Bound")
        return bucket

    def delete(self, name: str, bucket: str, reclaim: str) -> None:
        """The claim deleted: its bucket with it (reclaim policy Delete) or kept (Retain),
        then its ConfigMap, Secret and the claim itself."""
        if reclaim == "Delete":
            self.owner.delete_bucket(Bucket=bucket)
        for kind in ("configmap", "secret", "objectbucketclaim"):
            self.kubectl.run("delete", kind, name, "-n", self.namespace, "--wait=true")

    def ids(self, bucket: str) -> list[str]:
        """The notification Ids on the bucket, as its owner reads them."""
        found = self.owner.get_bucket_notification_configuration(Bucket=bucket)
        return [c["Id"] for c in found.get("TopicConfigurations", [])]

    def _status(self, name: str, phase: str) -> None:
        self.kubectl.run(
            "patch", "objectbucketclaim", name, "-n", self.namespace, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": {"phase": phase}}),
        )  # fmt: skip
