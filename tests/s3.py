"""An S3 client of the test user on a local gateway, the one every test writes objects with."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config

from tests.localservices import LocalService


def s3_client(rgw: LocalService, **config: Any) -> Any:
    """``config``: botocore ``Config`` options (retries, timeouts) for this client."""
    return boto3.client(
        "s3",
        endpoint_url=rgw["RGW_ENDPOINT"],
        aws_access_key_id=rgw["RGW_ACCESS_KEY"],
        aws_secret_access_key=rgw["RGW_SECRET_KEY"],
        # Empty unless the zonegroup has a name (docs/gateway-compatibility.md); boto3 needs
        # one to sign.
        region_name=rgw["RGW_REGION"] or "default",
        config=Config(**config),
    )


def sns_client(rgw: LocalService) -> Any:
    """The gateway's SNS API (topics) as the test user."""
    return boto3.client(
        "sns",
        endpoint_url=rgw["RGW_ENDPOINT"],
        aws_access_key_id=rgw["RGW_ACCESS_KEY"],
        aws_secret_access_key=rgw["RGW_SECRET_KEY"],
        region_name=rgw["RGW_REGION"] or "default",
    )
