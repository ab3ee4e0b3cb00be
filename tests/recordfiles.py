"""Delivery record files as the delivery service writes them (docs/records.md), for the Spark
job's tests and benchmark: gzip JSON lines under ``v1/date=YYYY-MM-DD/hour=HH/``."""

from __future__ import annotations

import gzip
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bucketnotify.records import SCHEMA_VERSION, DeliveryRecord, partition_of


def batch_name(replica: str, millis: int) -> str:
    return f"{replica}-{millis}-{uuid.uuid4().hex[:8]}.jsonl.gz"


def batch_key(records: list[DeliveryRecord], replica: str, millis: int) -> str:
    """``v1/date=.../hour=.../<replica>-<millis>-<random>.jsonl.gz`` of one batch: the
    partition is the hour of its records' outcome_time, which must be one hour."""
    partitions = {partition_of(r.outcome_time) for r in records}
    if len(partitions) != 1:
        raise ValueError(f"a batch spans several hours: {sorted(partitions)}")
    return f"v{SCHEMA_VERSION}/{partitions.pop()}/{batch_name(replica, millis)}"


def encode(lines: Iterable[str]) -> bytes:
    return gzip.compress("".join(f"{line}\n" for line in lines).encode(), mtime=0)


def encode_records(records: Iterable[DeliveryRecord]) -> bytes:
    return encode(r.to_json() for r in records)


class LocalFiles:
    """Writes batch files under a local directory (the embedded store's layout)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def put(self, key: str, data: bytes) -> str:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return str(path)


class S3Files:
    """Writes batch files to ``s3://bucket/prefix/`` with boto3 (the cluster default)."""

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")

    def put(self, key: str, data: bytes) -> str:
        full = f"{self.prefix}/{key}" if self.prefix else key
        self.client.put_object(Bucket=self.bucket, Key=full, Body=data)
        return f"s3a://{self.bucket}/{full}"
