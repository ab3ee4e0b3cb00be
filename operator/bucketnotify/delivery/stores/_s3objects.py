"""The S3 store's objects in its bucket: their keys, and the four requests on them (PUT,
GET, DELETE and LIST, sent on the event loop by ``gateway.objects``, cheaper than boto3 per
request), a bounded number in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from bucketnotify.delivery.model.queue import QueueName, Reservation
from bucketnotify.delivery.stores._format import COVER_SUFFIX, check_queue_name, reservation_name
from bucketnotify.gateway.connection import GatewayConnection
from bucketnotify.gateway.objects import ObjectClient

__all__ = ["LIST_PAGE", "BucketObjects", "Page", "all_of"]

T = TypeVar("T")
Page = tuple[list[tuple[str, str]], str | None]
"""One LIST page: (key, ETag) in key order, and the token of the next page or None."""

LIST_PAGE = 1000


class BucketObjects:
    """The objects under ``prefix`` in ``bucket``."""

    def __init__(
        self, connection: GatewayConnection, bucket: str, prefix: str, max_requests: int
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.client = ObjectClient(connection, bucket, max_requests)
        """The requests themselves, on the event loop."""
        self._requests = asyncio.Semaphore(max_requests)

    async def aclose(self) -> None:
        await self.client.aclose()

    # Keys

    def meta_key(self, queue: QueueName) -> str:
        check_queue_name(queue)
        return f"{self.prefix}meta/{queue.namespace}/{queue.topic}"

    def namespace_data(self, namespace: str) -> str:
        """Where every queue of ``namespace`` keeps its data (``data`` of each is below)."""
        return f"{self.prefix}data/{namespace}/"

    def data(self, queue: QueueName) -> str:
        check_queue_name(queue)
        return f"{self.namespace_data(queue.namespace)}{queue.topic}/"

    def marker(self, reservation: Reservation, *, cover: bool = False) -> str:
        name = reservation_name(reservation) + (COVER_SUFFIX if cover else "")
        return f"{self.data(reservation.queue)}reservations/{name}"

    def shard(self, queue: QueueName, shard: int) -> str:
        return f"{self.data(queue)}shard-{shard}/"

    def delivered(self, queue: QueueName, shard: int) -> str:
        return f"{self.data(queue)}delivered/shard-{shard}"

    # Requests

    async def call(self, operation: str, request: Callable[[], Awaitable[T]]) -> T:
        """``operation``: ``<S3 operation> <key or prefix>``, what the tests count requests by."""
        async with self._requests:
            return await request()

    async def put(self, key: str, body: bytes, content_type: str) -> str:
        """Writes the object; returns its ETag."""
        return await self.call(f"PutObject {key}", lambda: self.client.put(key, body, content_type))

    async def get(self, key: str) -> bytes | None:
        """The object's body; None when there is no such key."""
        return await self.call(f"GetObject {key}", lambda: self.client.get(key))

    async def delete(self, key: str) -> None:
        # DeleteObject of a missing key succeeds, so a second try or a lost race is fine.
        await self.call(f"DeleteObject {key}", lambda: self.client.delete(key))

    async def list_page(self, prefix: str, token: str | None, max_keys: int = 0) -> Page:
        """One page of (key, ETag) under ``prefix``, in key order, and the token of the next;
        ``max_keys``: at most this many keys (and never more than ``LIST_PAGE``)."""
        size = min(max_keys, LIST_PAGE) if max_keys else LIST_PAGE
        return await self.call(
            f"ListObjectsV2 {prefix}", lambda: self.client.list_page(prefix, size, token)
        )

    async def list_keys(self, prefix: str) -> list[str]:
        keys: list[str] = []
        token: str | None = None
        while True:
            page, token = await self.list_page(prefix, token)
            keys += [key for key, _ in page]
            if token is None:
                return keys


async def all_of(*calls: Awaitable[T]) -> list[T]:
    """Like gather, but every call has ended when it returns or raises: none runs on
    unseen after a failure (and into the next owner's turn), and the error is the first
    call's own, not an ExceptionGroup."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]
