"""The local gateway's test user (``ceph.sh``): boto3 clients, and our programs' settings."""

from __future__ import annotations

import json
import shlex
from typing import Any

import boto3
from botocore.config import Config

from devstack.services import Service

__all__ = [
    "SINGLE_ATTEMPT",
    "ceph_tool",
    "gateway_client",
    "gateway_settings",
    "listed_topic_names",
]

SINGLE_ATTEMPT: dict[str, Any] = {
    "retries": {"total_max_attempts": 1, "mode": "standard"},
    "max_pool_connections": 4,
    "connect_timeout": 10,
    "read_timeout": 60,
}
"""Client options where each event is counted (the benchmarks, the demo): no retries, as a
retried PUT may notify twice, which would count as a duplicate no delivery path made."""


def _region(rgw: Service) -> str:
    # Empty unless the zonegroup has a name (docs/gateway-compatibility.md); boto3 needs one
    # to sign.
    return rgw.env.get("RGW_REGION") or "default"


def gateway_client(rgw: Service, service: str = "s3", **config: Any) -> Any:
    """A boto3 ``service`` client ("s3", "sns") of the test user; ``config``: botocore
    ``Config`` options (retries, timeouts). A session of its own each: boto3 sessions are
    not thread-safe, and callers give each thread its own client."""
    return boto3.session.Session().client(
        service,  # type: ignore[call-overload]
        endpoint_url=rgw["RGW_ENDPOINT"],
        aws_access_key_id=rgw["RGW_ACCESS_KEY"],
        aws_secret_access_key=rgw["RGW_SECRET_KEY"],
        region_name=_region(rgw),
        config=Config(**config),
    )


def gateway_settings(rgw: Service) -> dict[str, str]:
    """The ``BUCKETNOTIFY_GATEWAY_*`` settings that point the operator, a delivery replica
    or the admin CLI at the gateway as the test user."""
    return {
        "BUCKETNOTIFY_GATEWAY_ENDPOINT": rgw["RGW_ENDPOINT"],
        "BUCKETNOTIFY_GATEWAY_ACCESS_KEY": rgw["RGW_ACCESS_KEY"],
        "BUCKETNOTIFY_GATEWAY_SECRET_KEY": rgw["RGW_SECRET_KEY"],
        "BUCKETNOTIFY_GATEWAY_REGION": _region(rgw),
    }


def ceph_tool(rgw: Service, tool: str, *args: str) -> list[str]:
    """The command line of a Ceph tool (``radosgw-admin``, ``ceph``, ``rados``) of the
    gateway's own release, on its cluster: a release other than the host's runs in its root,
    and the host's tools cannot read the keys a newer release made."""
    prefix = shlex.split(rgw["CEPH_TOOLS_PREFIX"])
    return [*prefix, tool, "-c", rgw["CEPH_CONF"], *args]


def listed_topic_names(listing: str) -> list[str]:
    """The topic names in the output of ``radosgw-admin topic list``, whose shape each
    release changed: ``{"topics": [{"topic": {"name": ...}, "subs": [...]}]}`` on 16.2, a
    list of topics on 20.2, and on 18.2 ``{"topics": [{"name": ...}]}``."""
    parsed = json.loads(listing)
    entries = parsed.get("topics", []) if isinstance(parsed, dict) else parsed
    return [str((entry.get("topic") or entry)["name"]) for entry in entries]
