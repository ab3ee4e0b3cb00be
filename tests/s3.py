"""The test user on a local gateway: the S3 and SNS clients every test writes objects and
topics with, and the ``GatewayConnection`` our gateway adapters are given."""

from __future__ import annotations

import uuid
from typing import Any

from bucketnotify.gateway.connection import GatewayConnection
from bucketnotify.gateway.release import GatewayRelease, detect_release
from devstack.gateway import gateway_client
from tests.localservices import LocalService

__all__ = ["DEAD_ENDPOINT", "connection", "s3_client", "sns_client", "unique"]

# Nothing listens on port 9 (discard): pushes to it fail at once.
DEAD_ENDPOINT = "http://127.0.0.1:9/x"


def unique(kind: str) -> str:
    """A bucket or topic name of its own for one test."""
    return f"{kind}-{uuid.uuid4().hex[:10]}"


def s3_client(rgw: LocalService, **config: Any) -> Any:
    """``config``: botocore ``Config`` options (retries, timeouts) for this client."""
    return gateway_client(rgw, "s3", **config)


def release_of(rgw: LocalService) -> GatewayRelease:
    """The Ceph release the test gateway says it runs, as the operator learns it (its
    ``Server`` header, else ``/admin/info``): the facts a test asserts about the gateway
    itself differ between releases, and a test branches on what the gateway is, not on
    what it was meant to be (``test_rgw_smoke.py`` checks that the two agree)."""
    endpoint = rgw["RGW_ENDPOINT"]
    if endpoint not in _ASKED:
        release = detect_release(endpoint)
        assert release.major is not None, f"the gateway at {endpoint} did not say: {release}"
        _ASKED[endpoint] = release
    return _ASKED[endpoint]


_ASKED: dict[str, GatewayRelease] = {}
"""What each gateway answered (two GETs once per endpoint, not per test)."""


def sns_client(rgw: LocalService) -> Any:
    """The gateway's SNS API (topics) as the test user."""
    return gateway_client(rgw, "sns")


def connection(
    rgw: LocalService, *, secret: str | None = None, other: bool = False
) -> GatewayConnection:
    """The test user's connection; ``other``: the second user's (``RGW_OTHER_*``), another
    tenant's view of the same gateway; ``secret``: that user's access key with this secret
    key instead (a wrong one, for refusals)."""
    prefix = "RGW_OTHER_" if other else "RGW_"
    return GatewayConnection(
        endpoint=rgw["RGW_ENDPOINT"],
        access_key=rgw[f"{prefix}ACCESS_KEY"],
        secret_key=secret or rgw[f"{prefix}SECRET_KEY"],
        region=rgw.env.get("RGW_REGION") or "default",
    )


def multipart_upload(s3: Any, bucket: str, key: str, body: bytes) -> None:
    """``key`` written as a one-part multipart upload (what emits CompleteMultipartUpload)."""
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)
    part = s3.upload_part(
        Bucket=bucket, Key=key, PartNumber=1, UploadId=upload["UploadId"], Body=body
    )
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key=key,
        UploadId=upload["UploadId"],
        MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]},
    )
