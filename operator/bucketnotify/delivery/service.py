"""The delivery service process: ingest, queue processing and Lease ownership together.

It learns the persistent Topics by listing them every ``refresh_interval_s`` (a watch would
react faster; a list every few seconds is enough for Topics, which change rarely), keeps an
open endpoint per Topic, serves the ingest, and runs rounds of ``process_shard`` over the
shards this replica owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from kubernetes_asyncio import client

from bucketnotify.api.common import GROUP, VERSION
from bucketnotify.api.topic import TopicSpec
from bucketnotify.controller.topic_builder import (
    INGEST_TOKEN_KEY,
    gateway_topic_name,
    ingest_token_secret,
)
from bucketnotify.delivery.endpoints.base import Endpoint
from bucketnotify.delivery.endpoints.factory import open_endpoint
from bucketnotify.delivery.ingest import Ingest, IngestTopic, build_app
from bucketnotify.delivery.ownership import Ownership
from bucketnotify.delivery.queue import QueueLimits, QueueName, QueueStore
from bucketnotify.delivery.worker import DeliveredCache, DeliveryPolicy, process_shard
from bucketnotify.kube import Kube, SecretMissing

__all__ = ["DeliveryService", "TopicRuntime"]

log = logging.getLogger(__name__)


@dataclass
class TopicRuntime:
    queue: QueueName
    shards: int
    policy: DeliveryPolicy
    endpoint: Endpoint
    generation: int
    delivered: dict[int, DeliveredCache] = field(default_factory=dict)


class DeliveryService:
    def __init__(
        self,
        *,
        api: client.ApiClient,
        store: QueueStore,
        ownership: Ownership,
        namespaces: list[str],
        refresh_interval_s: float = 3.0,
        round_interval_s: float = 0.2,
    ) -> None:
        self._custom = client.CustomObjectsApi(api)
        self._kube = Kube(api)
        self._store = store
        self._ownership = ownership
        self._namespaces = namespaces
        self._refresh_s = refresh_interval_s
        self._round_s = round_interval_s
        self.topics: dict[tuple[str, str], TopicRuntime] = {}
        self.ingest_topics: dict[tuple[str, str], IngestTopic] = {}
        self.ingest = Ingest(store, self.ingest_topics, self.resolve)
        # Unknown Topics looked up recently: a stray or hostile sender must not turn every
        # request into an API server call.
        self._misses: dict[tuple[str, str], float] = {}
        self._lock = asyncio.Lock()

    def app(self) -> web.Application:
        return build_app(self.ingest)

    async def _list_topics(self) -> list[dict[str, Any]]:
        if not self._namespaces:
            listed = await self._custom.list_cluster_custom_object(GROUP, VERSION, "topics")
            items: list[dict[str, Any]] = listed["items"]
            return items
        found: list[dict[str, Any]] = []
        for ns in self._namespaces:
            listed = await self._custom.list_namespaced_custom_object(GROUP, VERSION, ns, "topics")
            found += listed["items"]
        return found

    async def resolve(self, namespace: str, name: str) -> IngestTopic | None:
        """Look up one Topic now (it may have become Ready since the last refresh)."""
        key = (namespace, name)
        if time.monotonic() - self._misses.get(key, -1e9) < 1.0:
            return None
        async with self._lock:
            if key not in self.ingest_topics:
                try:
                    topic = await self._custom.get_namespaced_custom_object(
                        GROUP, VERSION, namespace, "topics", name
                    )
                    await self._consider(topic)
                except client.exceptions.ApiException as exc:
                    if exc.status != 404:
                        raise
        found = self.ingest_topics.get(key)
        if found is None:
            self._misses[key] = time.monotonic()
        return found

    async def refresh(self) -> None:
        """Bring the Topic table in line with the persistent Topics that exist now."""
        seen: set[tuple[str, str]] = set()
        async with self._lock:
            for topic in await self._list_topics():
                key = await self._consider(topic)
                if key is not None:
                    seen.add(key)
        for key in set(self.topics) - seen:
            runtime = self.topics.pop(key)
            self.ingest_topics.pop(key, None)
            await runtime.endpoint.aclose()

    async def _consider(self, topic: dict[str, Any]) -> tuple[str, str] | None:
        """Serve ``topic`` if it is persistent and has its token; returns its key then."""
        meta = topic["metadata"]
        key = (meta["namespace"], meta["name"])
        spec = TopicSpec.model_validate(topic["spec"])
        if not spec.persistent:
            return None
        try:
            token = await self._kube.secret_key(
                key[0], ingest_token_secret(key[1]), INGEST_TOKEN_KEY
            )
        except SecretMissing:
            return None  # the operator has not created it yet
        current = self.topics.get(key)
        if current is not None and current.generation == meta.get("generation"):
            self.ingest_topics[key] = IngestTopic(current.queue, token, current.shards)
        else:
            await self._open(key, spec, meta.get("generation", 0), token)
        return key

    async def _open(
        self, key: tuple[str, str], spec: TopicSpec, generation: int, token: str
    ) -> None:
        namespace, name = key
        delivery = spec.delivery
        shards = delivery.shards if delivery else 11
        limits = QueueLimits(
            max_entries=delivery.max_queue_entries if delivery else QueueLimits.max_entries,
            max_bytes=delivery.max_queue_bytes if delivery else QueueLimits.max_bytes,
        )
        queue = QueueName(namespace, name)
        await self._store.create(queue, shards, limits)
        credentials = None
        ref = (spec.endpoint.amqp and spec.endpoint.amqp.credentials_ref) or (
            spec.endpoint.kafka
            and spec.endpoint.kafka.sasl
            and spec.endpoint.kafka.sasl.credentials_ref
        )
        if ref:
            data = await self._kube.secret_data(namespace, ref.secret_name)
            credentials = (data[ref.username_key], data[ref.password_key])
        endpoint = open_endpoint(
            spec.endpoint,
            endpoint_topic=spec.endpoint_topic or gateway_topic_name(name, spec),
            credentials=credentials,
            ca_pem=None,
        )
        old = self.topics.get(key)
        self.topics[key] = TopicRuntime(
            queue=queue,
            shards=shards,
            policy=DeliveryPolicy(
                time_to_live_s=spec.time_to_live or 0,
                max_retries=spec.max_retries or 0,
                retry_sleep_s=spec.retry_sleep_duration or 0,
            ),
            endpoint=endpoint,
            generation=generation,
        )
        self.ingest_topics[key] = IngestTopic(queue, token, shards)
        if old is not None:
            await old.endpoint.aclose()
        log.info("serving persistent topic %s/%s (%d shards)", namespace, name, shards)

    async def round(self) -> None:
        """One processing round over every owned shard of every Topic."""
        work = []
        for runtime in list(self.topics.values()):
            for shard in range(runtime.shards):
                if self._ownership.owns_shard(runtime.queue, shard):
                    work.append(self._process(runtime, shard))
        await asyncio.gather(*work)

    async def _process(self, runtime: TopicRuntime, shard: int) -> None:
        queue = runtime.queue
        try:
            result = await process_shard(
                store=self._store,
                queue=queue,
                shard=shard,
                endpoint=runtime.endpoint,
                policy=runtime.policy,
                delivered=runtime.delivered.setdefault(shard, DeliveredCache()),
                still_owned=lambda: self._ownership.owns_shard(queue, shard),
                now=time.time(),
            )
        except Exception:
            log.exception("round of %s shard %d failed", queue, shard)
            return
        if result.delivered or result.failed or result.expired or result.duplicates:
            log.info(
                "%s shard %d: delivered %d failed %d lost %d duplicates %d%s",
                queue,
                shard,
                result.delivered,
                result.failed,
                result.expired,
                result.duplicates,
                " (fenced)" if result.fenced else "",
            )

    async def run(self, stop: asyncio.Event) -> None:
        await self._ownership.start()
        last_refresh = 0.0
        try:
            while not stop.is_set():
                if time.monotonic() - last_refresh > self._refresh_s:
                    try:
                        await self.refresh()
                    except Exception:
                        log.exception("refreshing the topic table failed")
                    last_refresh = time.monotonic()
                await self.round()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._round_s)
        finally:
            await self._ownership.stop(release=True)
            for runtime in self.topics.values():
                await runtime.endpoint.aclose()
