"""Where delivery records are written (BUCKETNOTIFY_DELIVERY_RECORDS): a directory or a bucket.

Both targets write whole files atomically, so a reader (the Spark job) never sees half a
batch, and writing a path again replaces it:

- ``DirTarget``: the file is written under ``<root>/.tmp/``, fsynced, renamed into its
  partition directory, and the directory fsynced. A crash can leave a file in ``.tmp``
  (outside ``v1/``, where no reader looks); files there older than an hour are removed
  when the target is opened.
- ``S3Target``: one PutObject per batch (S3 makes an object visible whole or not at all),
  with the gateway client of the queue store (``stores.open.gateway_connection``); the
  bucket is created at the first write that finds it missing. The records bucket must not
  get a notification configuration: the service's own writes would notify it.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from bucketnotify.delivery.recorded.delivery_records import RecordTarget
from bucketnotify.delivery.stores.open import StoreConfigError, gateway_connection
from bucketnotify.gateway.connection import GatewayConnection
from bucketnotify.gateway.errors import mapped_errors
from bucketnotify.settings import OperatorSettings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["DirTarget", "S3Target", "records_target_for"]

STALE_TMP_S = 3600.0


class DirTarget:
    """Batches as files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._tmp = root / ".tmp"
        self._tmp.mkdir(parents=True, exist_ok=True)
        for leftover in self._tmp.iterdir():
            # A write in progress takes milliseconds; anything this old was cut off by a crash.
            if time.time() - leftover.stat().st_mtime > STALE_TMP_S:
                leftover.unlink(missing_ok=True)

    def __str__(self) -> str:
        return f"dir://{self.root}"

    async def write(self, path: str, body: bytes) -> None:
        await asyncio.to_thread(self._write, path, body)

    def _write(self, path: str, body: bytes) -> None:
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self._tmp, prefix=target.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(body)
                file.flush()
                os.fsync(file.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        directory = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


class S3Target:
    """Batches as objects in ``bucket`` under ``prefix`` on the gateway."""

    def __init__(self, connection: GatewayConnection, bucket: str, prefix: str = "") -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._s3: S3Client = connection.s3()

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    async def write(self, path: str, body: bytes) -> None:
        key = self.prefix + path
        await asyncio.to_thread(self._write, key, body)

    def _write(self, key: str, body: bytes) -> None:
        with mapped_errors(f"PutObject {self.bucket}/{key}"):
            try:
                self._put(key, body)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "NoSuchBucket":
                    raise
                self._create_bucket()
                self._put(key, body)

    def _put(self, key: str, body: bytes) -> None:
        self._s3.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/gzip")

    def _create_bucket(self) -> None:
        try:
            self._s3.create_bucket(Bucket=self.bucket)
        except ClientError as exc:
            # Another replica won the race.
            if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                raise


def records_target_for(url: str, store_url: str, operator: OperatorSettings) -> RecordTarget | None:
    """The target ``url`` names; None for ``off``.

    ``auto`` (or empty) puts the records next to the queues of ``store_url``: a queue store
    ``s3://<bucket>`` gets ``s3://<bucket>/records`` (the queues are under ``queues/``), a
    ``dir:///<path>/queues`` gets ``dir:///<path>/records`` (the directory beside it).
    Raises ``StoreConfigError`` naming the setting to fix.
    """
    url = url.strip()
    if url == "off":
        return None
    if url in ("", "auto"):
        scheme, _, rest = store_url.partition("://")
        if scheme == "s3" and rest:
            url = f"s3://{rest.split('/', 1)[0]}/records"
        elif scheme == "dir" and rest.startswith("/"):
            url = f"dir://{Path(rest).parent / 'records'}"
        else:
            raise StoreConfigError(
                "BUCKETNOTIFY_DELIVERY_RECORDS=auto needs a dir:// or s3:// queue store"
            )
    scheme, _, rest = url.partition("://")
    if scheme == "dir" and rest.startswith("/"):
        return DirTarget(Path(rest))
    if scheme == "s3" and rest and not rest.startswith("/"):
        bucket, _, prefix = rest.partition("/")
        return S3Target(gateway_connection(operator, "s3:// delivery records"), bucket, prefix)
    # The value stays out of the message: a URL may carry more than its owner meant to show.
    raise StoreConfigError(
        "BUCKETNOTIFY_DELIVERY_RECORDS: use auto, off, dir:///absolute/path or s3://bucket[/prefix]"
    )
