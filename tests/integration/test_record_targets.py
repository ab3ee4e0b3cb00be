"""Delivery records on the real gateway: whole objects under the prefix, the bucket made on
the first write, and a refused write that raises (so the writer keeps the batch)."""

from __future__ import annotations

import gzip
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from bucketnotify.delivery.recorded.delivery_records import RecordWriter
from bucketnotify.delivery.recorded.record_targets import S3Target
from bucketnotify.gateway.errors import GatewayAccessDenied
from bucketnotify.metrics import DeliveryMetrics
from bucketnotify.records import DeliveryRecord, Outcome
from tests.localservices import LocalService
from tests.s3 import connection

pytestmark = pytest.mark.integration


@pytest.fixture()
def bucket(rgw: LocalService) -> Iterator[str]:
    """A bucket name nobody has created yet; emptied and removed afterwards."""
    name = f"records-{uuid.uuid4().hex[:10]}"
    yield name
    s3 = connection(rgw).s3()
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=name, Key=obj["Key"])
        s3.delete_bucket(Bucket=name)
    except s3.exceptions.NoSuchBucket:
        pass


def record(n: int) -> DeliveryRecord:
    return DeliveryRecord(
        outcome=Outcome.DELIVERED,
        namespace="ns",
        topic="t",
        bucket="b",
        key=f"k{n}",
        event_name="ObjectCreated:Put",
        configuration_id="c",
        event_id=f"e{n}",
        event_time=None,
        ingest_time=1_795_329_000.0,
        outcome_time=1_795_329_000.0 + n,
        attempts=1,
        endpoint_kind="http",
        shard=0,
        replica="r",
    )


def objects(rgw: LocalService, bucket: str) -> dict[str, list[dict[str, Any]]]:
    s3 = connection(rgw).s3()
    found = {}
    for obj in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
        body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
        found[obj["Key"]] = [json.loads(line) for line in gzip.decompress(body).splitlines()]
    return found


async def test_batches_land_whole_under_the_prefix_in_a_bucket_made_on_demand(
    rgw: LocalService, bucket: str
) -> None:
    metrics = DeliveryMetrics()
    writer = RecordWriter(
        S3Target(connection(rgw), bucket, "reports/records"), replica="r", metrics=metrics
    )
    for n in range(3):
        writer.add(record(n))
    assert await writer.flush()
    found = objects(rgw, bucket)
    assert len(found) == 1
    [(key, records)] = found.items()
    assert key.startswith("reports/records/v1/date=2026-11-22/hour=06/r-"), key
    assert key.endswith(".jsonl.gz")
    assert [r["key"] for r in records] == ["k0", "k1", "k2"]
    assert metrics.registry.get_sample_value("bucketnotify_records_written_total") == 3


async def test_a_refused_write_raises_without_the_secret_and_keeps_the_batch(
    rgw: LocalService, bucket: str
) -> None:
    metrics = DeliveryMetrics()
    wrong = "wrong-secret-key-0000000000000000000000"
    writer = RecordWriter(
        S3Target(connection(rgw, secret=wrong), bucket), replica="r", metrics=metrics
    )
    with pytest.raises(GatewayAccessDenied) as raised:
        await writer.target.write("v1/x.jsonl.gz", b"")
    assert wrong not in str(raised.value)
    writer.add(record(0))
    assert not await writer.flush()
    assert writer.buffered == 1
    assert metrics.registry.get_sample_value("bucketnotify_records_write_failures_total") == 1
    # The same batch, now with the right keys.
    writer.target = S3Target(connection(rgw), bucket)
    assert await writer.flush()
    assert [r["key"] for records in objects(rgw, bucket).values() for r in records] == ["k0"]
