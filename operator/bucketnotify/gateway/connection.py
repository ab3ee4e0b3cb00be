"""Where the gateway is and whose keys to use; boto3 clients built from that."""

from __future__ import annotations

import functools
import os
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote, urlencode, urlsplit

import boto3
from botocore.config import Config
from botocore.httpsession import get_cert_path

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sns import SNSClient

__all__ = ["GATEWAY_KINDS", "GatewayConnection", "GatewayKind", "same_endpoint"]

# Short timeouts and no silent retries: the operator retries with backoff and reports the
# failure in the object's status, which a hidden retry loop here would only delay.
CLIENT_CONFIG = Config(
    connect_timeout=5,
    read_timeout=20,
    retries={"max_attempts": 1, "mode": "standard"},
    s3={"addressing_style": "path"},
)


def _spaces_as_percent_20(request: Any, **_: Any) -> None:
    """Form-encode the SNS request with %20 for a space, before it is signed.

    botocore writes a space as ``+``, which Ceph (16.2, measured) stores literally: an
    opaqueData of "a b" reached every event as "a+b"."""
    if isinstance(request.data, dict):
        request.data = urlencode(request.data, quote_via=quote)


GatewayKind = Literal["ceph", "obs"]
GATEWAY_KINDS: tuple[GatewayKind, ...] = ("ceph", "obs")


@dataclass(frozen=True)
class GatewayConnection:
    """One gateway endpoint and one user's keys. The secret key never appears in repr."""

    endpoint: str
    access_key: str
    secret_key: str = field(repr=False)
    region: str = "default"
    kind: GatewayKind = "ceph"
    """Whose API: ``ceph`` (RGW: S3 and SNS) or ``obs`` (Huawei OBS: its S3 dialect for
    notifications, SMN topics, no SNS API)."""

    def sns(self) -> SNSClient:
        sns = boto3.client(
            "sns",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=CLIENT_CONFIG,
        )
        sns.meta.events.register("before-sign.sns.*", _spaces_as_percent_20)
        return sns

    def ssl_context(self) -> ssl.SSLContext:
        """What boto3 verifies the gateway's certificate with, for our own HTTP clients: the
        CA bundle named by ``AWS_CA_BUNDLE`` (a private CA, docs/operator.md), else the one
        botocore ships or takes from certifi (not the system's: slim images have none)."""
        return _verifying(os.environ.get("AWS_CA_BUNDLE") or str(get_cert_path(True)))

    def s3(self) -> S3Client:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=CLIENT_CONFIG,
        )


@functools.lru_cache(maxsize=4)
def _verifying(ca_bundle: str) -> ssl.SSLContext:
    # One per bundle: a context costs memory and, on a loaded machine, noticeable CPU to
    # build (docs/performance-notes.md).
    return ssl.create_default_context(cafile=ca_bundle)


def same_endpoint(a: str, b: str) -> bool:
    """Whether two gateway URLs name the same gateway: a port written out that is the
    scheme's default (an ObjectBucketClaim's ``BUCKET_PORT`` always is) and a trailing
    slash make no difference; host names are compared without case."""

    def key(url: str) -> tuple[str, str, int | None, str]:
        parts = urlsplit(url.strip())
        scheme = parts.scheme.lower()
        port = parts.port or {"http": 80, "https": 443}.get(scheme)
        return scheme, (parts.hostname or "").lower(), port, parts.path.rstrip("/")

    return key(a) == key(b)
