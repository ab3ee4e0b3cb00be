"""The Topic table of a delivery replica: which persistent Topics it serves, each with its
queue, endpoint and policy (``TopicRuntime``), and the ingest's view of them
(``IngestTopic``, with the tokens of ``delivery.topics.ingest_tokens``).

Topics are followed with a watch (``topic_watch``) and the table brought in line with them
every ``refresh_interval_s`` (Topics change rarely; listed instead while the watch has not
listed them all once, or may not watch), and looked up at once when the gateway pushes for
one not seen yet (``resolve``). A Topic's spec is validated again only when its
resourceVersion changed. The Secrets a Topic uses (ingest token, broker
credentials, CA bundle) are read when the Topic is new or changed and again every
``secret_refresh_s``, not on every list: a thousand Topics must not cost a thousand Secret
reads every few seconds.

A Topic that changes gets a new runtime; the old one's shard loops are let finish first
(``ShardRunner.release``: the rounds run them, and implement that interface). A Topic that
stops being persistent is drained (delivered from its queue until empty); a deleted one
takes its queue with it (``retire``). An endpoint that cannot be opened as specified
(missing credentials or CA, an unsupported SASL mechanism) does not stop the ingest: events
wait in the queue until the Topic or its Secret is fixed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from bucketnotify.api.common import GROUP, VERSION
from bucketnotify.api.topic import (
    ClientCertificate,
    Credentials,
    DeliverySettings,
    TopicSpec,
    broker_cleartext_refusal,
    endpoint_topic_name,
)
from bucketnotify.delivery.endpoints.base import Endpoint
from bucketnotify.delivery.endpoints.errors import ConfigurationError
from bucketnotify.delivery.endpoints.factory import open_endpoint
from bucketnotify.delivery.model.dead_letters import SHARDS as DEAD_LETTER_SHARDS
from bucketnotify.delivery.model.dead_letters import dead_letter_queue
from bucketnotify.delivery.model.delivered_ids import DeliveredCache
from bucketnotify.delivery.model.outcomes import DeliveryPolicy
from bucketnotify.delivery.model.queue import QueueLimits, QueueName, QueueStore, StoreUnavailable
from bucketnotify.delivery.recorded.health import DeliveryHealth
from bucketnotify.delivery.recorded.kube_events import TopicEvents
from bucketnotify.delivery.topics.ingest_tokens import IngestTokens, IngestTopic, TopicKey
from bucketnotify.delivery.topics.topic_watch import TopicWatch
from bucketnotify.kube.apiserver import ApiClient, ApiError, object_path, transient
from bucketnotify.kube.objects import Kube, SecretMissing
from bucketnotify.metrics import DeliveryMetrics

__all__ = ["MISS_TTL_S", "TopicKey", "TopicRuntime", "TopicTable"]

log = logging.getLogger(__name__)

# How long a Topic the API server did not have is not asked for again.
MISS_TTL_S = 1.0

LIST_CONCURRENCY = 8
"""Namespaces listed at once by a refresh (a replica scoped to 200 lists each of them)."""
CACHED = {"resourceVersion": "0"}
"""A refresh's lists are answered from the API server's watch cache, not by a quorum read of
etcd: a replica scoped to many namespaces lists each every few seconds, and a Topic newer
than the cache is looked up by its first event anyway (``resolve``)."""
LOOKUP_PATIENCE_S = 3.0
"""How long ``resolve`` asks a throttling (429) or failing API server again before it gives
up: the gateway's push waits for the answer (a sync hand-off's upload too), and a Topic
looked up a moment later is an event kept rather than refused."""
SECRETS_LISTED_FROM = 2
"""Topics of one namespace due for a Secret re-read from which a refresh lists the namespace's
Secrets labelled as ours once (from the watch cache) instead of reading each: with 5,000
persistent Topics and a 30 s re-read, one read each is 170 requests a second per replica.
Every persistent Topic of a listed namespace takes its Secrets from the list then, so their
re-reads fall due together after. A Secret the list does not hold is still read on its
own."""
UNLISTED_WARN_EVERY_S = 60.0
"""How often a namespace whose Topics cannot be listed is named in a WARNING, and a Topic
that cannot be served for a while (the API server throttling or away) in another."""


class EndpointInputs(NamedTuple):
    """What an endpoint is opened with besides its spec, read from Secrets and ConfigMaps."""

    credentials: Credentials | None
    ca_pem: str | None
    client: ClientCertificate | None


@dataclass
class TopicRuntime:
    queue: QueueName
    shards: int
    policy: DeliveryPolicy
    endpoint: Endpoint | None
    """None while the endpoint cannot be opened as specified (``problem`` says why)."""
    fingerprint: str
    """Changes with everything the endpoint was opened from (spec, credentials, CA)."""
    generation: int
    secrets_read_at: float
    problem: str | None = None
    draining: bool = False
    """No longer persistent: deliver what is queued, then delete the queue."""
    empty_sweeps: int = 0
    """Sweeps in a row that found the draining queue empty."""
    dead_letter: str | None = None
    """Topic (same namespace) whose queue takes this one's dropped events."""
    kept_dead_letters: QueueLimits | None = None
    """The bounds of this Topic's own dead-letter queue, when it keeps its dead letters."""
    delivered: dict[int, DeliveredCache] = field(default_factory=dict)
    delivered_saved: dict[int, tuple[int, float]] = field(default_factory=dict)
    """Per shard: ``DeliveredCache.added`` at the last save to the store, and when."""
    endpoint_kind: str | None = None
    """http, amqp or kafka (for delivery records)."""
    uid: str = ""
    """The Topic object's uid: a Topic deleted and made again under its name is new."""


def _fingerprint(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


class ShardRunner(Protocol):
    """What the Topics ask of the room that runs their shards (``delivery.rounds``'
    ``ShardLoops`` implements it): the calls from here to the room above."""

    async def release(self, queue: QueueName) -> None:
        """End the shard loops of ``queue``; their rounds finish first."""
        ...

    def wake(self, queue: QueueName, shard: int) -> None:
        """The shard has entries: its loop here, or its owner, is told."""
        ...

    def wake_local(self, queue: QueueName, shard: int) -> None:
        """The shard has entries: its loop here is told, if it runs here."""
        ...


class TopicTable:
    MAX_MISSES = 10_000
    """Unknown Topics remembered (each a recent lookup that found nothing)."""

    def __init__(
        self,
        *,
        api: ApiClient,
        store: QueueStore,
        namespaces: list[str],
        metrics: DeliveryMetrics,
        events: TopicEvents,
        health: DeliveryHealth,
        topics: dict[TopicKey, TopicRuntime],
        runner: ShardRunner,
        secret_refresh_s: float,
        token_overlap_s: float,
        reservation_timeout_s: float,
        allow_cleartext_secrets: bool = False,
    ) -> None:
        self._api = api
        self.kube = Kube(api)
        self._store = store
        self._namespaces = namespaces
        self.metrics = metrics
        self.events = events
        self.health = health
        self._runner = runner
        self._secret_refresh_s = secret_refresh_s
        self._reservation_timeout_s = reservation_timeout_s
        self._allow_cleartext = allow_cleartext_secrets
        self.topics = topics
        """The Topics served, by key: shared with the shard loops, which read it."""
        self.ingest_topics: dict[TopicKey, IngestTopic] = {}
        self.tokens = IngestTokens(self.kube, self.ingest_topics, token_overlap_s)
        self.watch = TopicWatch(api, namespaces)
        """The Topics as the API server's watch keeps them (its ``run`` is the service's)."""
        # Unknown Topics looked up recently: a stray or hostile sender must not turn every
        # request into an API server call.
        self._misses: dict[TopicKey, float] = {}
        self._unlisted_warned: dict[str, float] = {}
        self._unserved: dict[TopicKey, tuple[str, float]] = {}
        """Topics the last refresh could not serve: what was said of each, and when."""
        self._specs: dict[TopicKey, tuple[str, TopicSpec]] = {}
        """Each Topic's spec as last validated, with the resourceVersion it came with: a
        refresh every few seconds validates only what changed."""
        self._secret_list_refused = False
        self._lock = asyncio.Lock()
        self.stored: set[QueueName] = set()
        """Queues the store held at the last sweep (finds queues to drain after a restart)."""

    async def aclose(self) -> None:
        for runtime in self.topics.values():
            if runtime.endpoint is not None:
                await runtime.endpoint.aclose()

    def in_scope(self, namespace: str) -> bool:
        return not self._namespaces or namespace in self._namespaces

    async def _list_topics(self) -> tuple[list[dict[str, Any]], set[str]]:
        """The Topics in scope, and the namespaces whose list failed: as the watch keeps
        them once it has listed every namespace, else listed now."""
        if self.watch.ready:
            return self.watch.snapshot()
        return await self._list_now()

    async def _list_now(self) -> tuple[list[dict[str, Any]], set[str]]:
        """The Topics in scope as listed now, and the namespaces whose list failed.

        A namespace that cannot be listed (deleted with its Role, a hiccup of the API
        server) does not stop the refresh of the others, and its Topics are kept as they
        were: retiring them would drop their ingest. When no namespace can be listed at
        all, the refresh fails as a whole."""
        if not self._namespaces:
            listed = await self._api.get(object_path(GROUP, VERSION, "topics"), params=CACHED)
            items: list[dict[str, Any]] = listed["items"]
            return items, set()
        limit = asyncio.Semaphore(LIST_CONCURRENCY)

        async def one(namespace: str) -> list[dict[str, Any]]:
            async with limit:
                listed = await self._api.get(
                    object_path(GROUP, VERSION, "topics", namespace), params=CACHED
                )
            found: list[dict[str, Any]] = listed["items"]
            return found

        results = await asyncio.gather(
            *(one(ns) for ns in self._namespaces), return_exceptions=True
        )
        found: list[dict[str, Any]] = []
        failed: dict[str, Exception] = {}
        for namespace, result in zip(self._namespaces, results, strict=True):
            if isinstance(result, Exception):
                failed[namespace] = result
            elif isinstance(result, BaseException):
                raise result
            else:
                found += result
        if failed and len(failed) == len(self._namespaces):
            raise next(iter(failed.values()))
        now = time.monotonic()
        for namespace, exc in failed.items():
            if now - self._unlisted_warned.get(namespace, -1e9) >= UNLISTED_WARN_EVERY_S:
                self._unlisted_warned[namespace] = now
                log.warning(
                    "cannot list the Topics of namespace %s, keeping those it had: %s",
                    namespace,
                    str(exc) or type(exc).__name__,
                )
        return found, set(failed)

    async def resolve(self, namespace: str, name: str) -> IngestTopic | None:
        """Look up one Topic now (it may have become Ready since the last refresh)."""
        key = (namespace, name)
        if not self.in_scope(namespace):
            return None
        if time.monotonic() - self._misses.get(key, -1e9) < MISS_TTL_S:
            return None
        async with self._lock:
            if key not in self.ingest_topics:
                try:
                    await self._look_up(namespace, name)
                except ApiError as exc:
                    if exc.status != 404:
                        raise
        found = self.ingest_topics.get(key)
        if found is None:
            # Oldest first, so the bound drops the stalest: a sender inventing names must
            # not grow the replica's memory without end.
            self._misses.pop(key, None)
            self._misses[key] = time.monotonic()
            while len(self._misses) > self.MAX_MISSES:
                del self._misses[next(iter(self._misses))]
        return found

    async def _look_up(self, namespace: str, name: str) -> None:
        """Read the Topic and serve it; asked again while the API server refuses for now
        (``transient``), for at most LOOKUP_PATIENCE_S."""
        deadline = time.monotonic() + LOOKUP_PATIENCE_S
        pause = 0.1
        while True:
            try:
                topic = await self._api.get(object_path(GROUP, VERSION, "topics", namespace, name))
                await self.consider(topic)
                return
            except Exception as exc:
                if not transient(exc) or time.monotonic() + pause > deadline:
                    raise
            await asyncio.sleep(pause)
            pause = min(2 * pause, 1.0)

    async def refresh(self) -> None:
        """Bring the Topic table in line with the Topics that exist now."""
        seen: set[TopicKey] = set()
        async with self._lock:
            listed, unlisted = await self._list_topics()
            kube, reread = await self._secrets_listed(listed)
            for topic in listed:
                meta = topic["metadata"]
                seen.add((meta["namespace"], meta["name"]))
                key = (meta["namespace"], meta["name"])
                try:
                    await self.consider(topic, kube, reread=key[0] in reread)
                except Exception as exc:
                    # One broken Topic must not keep the others from being served.
                    self._cannot_serve(key, exc)
                else:
                    self._unserved.pop(key, None)
        for key in set(self.topics) - seen:
            if key[0] not in unlisted:
                await self.retire(key, reason="its Topic was deleted", dead_letters=True)
        # Drop the ingest of Topics the list no longer shows even without a runtime.
        for key in set(self.ingest_topics) - seen:
            if key[0] not in unlisted:
                self.ingest_topics.pop(key, None)
        for key in set(self._specs) - seen:
            if key[0] not in unlisted:
                del self._specs[key]

    async def _secrets_listed(self, listed: list[dict[str, Any]]) -> tuple[Kube, set[str]]:
        """The client a refresh reads Secrets with: from one list of each namespace where
        SECRETS_LISTED_FROM Topics or more are due for a re-read, else one read each (also
        when the replica may not list Secrets: a Role of an older release); and the
        namespaces listed."""
        if self._secret_list_refused:
            return self.kube, set()
        due: Counter[str] = Counter()
        for topic in listed:
            meta = topic["metadata"]
            key = (meta["namespace"], meta["name"])
            with contextlib.suppress(Exception):  # consider() says what is wrong with it
                spec = self._spec(key, topic)
                if spec.persistent and self._secrets_due(key, int(meta.get("generation") or 0)):
                    due[key[0]] += 1
        secrets: dict[str, dict[str, dict[str, Any]]] = {}
        for namespace, count in due.items():
            if count < SECRETS_LISTED_FROM:
                continue
            try:
                secrets[namespace] = await self.kube.list_secrets(namespace)
            except Exception as exc:
                if not (isinstance(exc, ApiError) and exc.status == 403):
                    # Read one by one this time; each Topic says what fails for it.
                    log.debug("listing the Secrets of %s failed", namespace, exc_info=exc)
                    continue
                self._secret_list_refused = True
                log.warning(
                    "this replica may not list Secrets (its Role predates it): it reads each"
                    " Topic's Secrets one by one, one request each every %.0f s",
                    self._secret_refresh_s,
                )
                return self.kube, set()
        return self.kube.reading_from(secrets), set(secrets)

    def _spec(self, key: TopicKey, topic: dict[str, Any]) -> TopicSpec:
        version = str(topic["metadata"].get("resourceVersion") or "")
        known = self._specs.get(key)
        if known is not None and version and known[0] == version:
            return known[1]
        spec = TopicSpec.model_validate(topic["spec"])
        self._specs[key] = (version, spec)
        return spec

    def _secrets_due(self, key: TopicKey, generation: int) -> bool:
        """Whether a persistent Topic's runtime and Secrets are to be read (again) now."""
        current = self.topics.get(key)
        return (
            current is None
            or current.generation != generation
            or current.draining
            # Its token Secret did not exist yet (the operator creates it as the Topic gets
            # Ready): look again now, not a secret_refresh_s later, or the ingest answers 404.
            or key not in self.ingest_topics
            or time.monotonic() - current.secrets_read_at > self._secret_refresh_s
        )

    def _cannot_serve(self, key: TopicKey, exc: Exception) -> None:
        """Say why a Topic is not served (its events wait in its queue meanwhile): a failure
        the next refresh may get over (the API server throttling or away, the queue store
        away) as a WARNING at most every UNLISTED_WARN_EVERY_S; anything else once, as an
        ERROR naming what to fix, until it changes. Neither with a traceback: under a
        throttling API server every Topic fails each refresh, and a traceback per Topic
        and refresh would bury what matters (it goes to DEBUG, for a defect of ours)."""
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        said, at = self._unserved.get(key, ("", -1e9))
        now = time.monotonic()
        if transient(exc) or isinstance(exc, StoreUnavailable):
            if now - at >= UNLISTED_WARN_EVERY_S:
                self._unserved[key] = (reason, now)
                log.warning(
                    "topic %s/%s cannot be read now: %s (its queue keeps its events; tried"
                    " again at the next refresh)",
                    *key,
                    reason,
                )
        elif reason != said:
            self._unserved[key] = (reason, now)
            log.error(
                "topic %s/%s cannot be served: %s; its events wait in its queue until the"
                " Topic or what it refers to is fixed",
                *key,
                reason,
            )
        log.debug("topic %s/%s not served", *key, exc_info=exc)

    async def consider(
        self, topic: dict[str, Any], kube: Kube | None = None, *, reread: bool = False
    ) -> None:
        """Serve, change, drain or leave the Topic as it now is; Secrets read with ``kube``
        (default: this table's own client), and with ``reread`` even before they are due."""
        meta = topic["metadata"]
        key: TopicKey = (meta["namespace"], meta["name"])
        spec = self._spec(key, topic)
        generation = int(meta.get("generation") or 0)
        uid = str(meta.get("uid") or "")
        current = self.topics.get(key)
        queue = QueueName(*key)
        if not spec.persistent:
            self.ingest_topics.pop(key, None)
            if current is None and queue not in self.stored:
                return
            # It was persistent: what is queued still goes out, then the queue goes.
            if current is None or current.generation != generation:
                await self._open(key, spec, generation, uid, draining=True, kube=kube)
            return
        if not (reread or self._secrets_due(key, generation)):
            return
        started = time.monotonic()
        tokens = await self.tokens.read(key, kube)
        await self._open(key, spec, generation, uid, draining=False, kube=kube)
        runtime = self.topics[key]
        self.tokens.take(key, runtime.queue, runtime.shards, tokens, started)

    async def _endpoint_inputs(
        self, namespace: str, spec: TopicSpec, kube: Kube | None = None
    ) -> EndpointInputs:
        kube = kube or self.kube
        return EndpointInputs(
            await kube.endpoint_credentials(namespace, spec.endpoint),
            await kube.endpoint_ca(namespace, spec.endpoint),
            await kube.endpoint_client_certificate(namespace, spec.endpoint),
        )

    async def _open(
        self,
        key: TopicKey,
        spec: TopicSpec,
        generation: int,
        uid: str,
        *,
        draining: bool,
        kube: Kube | None = None,
    ) -> None:
        namespace, name = key
        delivery = spec.delivery
        queue = QueueName(namespace, name)
        old = self.topics.get(key)
        shards = await self._queue_for(queue, spec, old, generation, uid, draining=draining)
        endpoint: Endpoint | None = None
        problem: tuple[str, str] | None = None
        """What keeps the endpoint from opening, and its Event reason."""
        try:
            inputs = await self._endpoint_inputs(namespace, spec, kube)
            # Credentials and certificate as plain tuples: their own reprs hide the secrets,
            # and a rotated password or certificate must change the fingerprint.
            fingerprint = _fingerprint(
                spec.model_dump(),
                tuple(inputs.credentials) if inputs.credentials else None,
                inputs.ca_pem,
                tuple(inputs.client) if inputs.client else None,
                generation,
                shards,
                draining,
            )
        except SecretMissing as exc:
            problem = str(exc), "SecretNotFound"
            fingerprint = _fingerprint(problem[0], generation, draining)
        if old is not None and old.fingerprint == fingerprint and old.uid == uid:
            old.secrets_read_at = time.monotonic()
            return
        if problem is None:
            endpoint, problem = self._open_endpoint(name, spec, inputs)
        if problem is not None and (old is None or old.problem != problem[0]):
            # Events keep being accepted and wait in the queue until this is fixed.
            log.error("topic %s/%s: not delivering: %s", namespace, name, problem[0])
        self.events.endpoint_state(namespace, name, *(problem or (None, "")))
        self.topics[key] = TopicRuntime(
            queue=queue,
            shards=shards,
            policy=DeliveryPolicy(
                time_to_live_s=spec.time_to_live or 0,
                max_retries=spec.max_retries or 0,
                retry_sleep_s=spec.retry_sleep_duration or 0,
                backoff=(delivery or DeliverySettings()).retry_backoff,
                max_retry_sleep_s=(delivery or DeliverySettings()).max_retry_sleep_duration,
            ),
            endpoint=endpoint,
            fingerprint=fingerprint,
            generation=generation,
            secrets_read_at=time.monotonic(),
            problem=problem[0] if problem else None,
            draining=draining,
            dead_letter=delivery.dead_letter_topic if delivery else None,
            kept_dead_letters=self._dead_letter_limits(spec),
            delivered=old.delivered if old is not None else {},
            endpoint_kind=spec.endpoint.kind,
            uid=uid,
        )
        self.metrics.add_topic(namespace, name)
        if old is not None:
            # The old runtime's loops finish their round and end; new ones start with the
            # new endpoint at the next supervision.
            await self._runner.release(queue)
            if old.endpoint is not None:
                await old.endpoint.aclose()
        log.info(
            "%s topic %s/%s (%d shards)",
            "draining" if draining else "serving",
            namespace,
            name,
            shards,
        )

    async def _queue_for(
        self,
        queue: QueueName,
        spec: TopicSpec,
        old: TopicRuntime | None,
        generation: int,
        uid: str,
        *,
        draining: bool,
    ) -> int:
        """The queue's shards, the queue created or updated where it may be new or changed."""
        delivery = spec.delivery
        if draining or not (
            old is None or old.generation != generation or old.uid != uid or old.draining
        ):
            # Only when the queue may be new or its settings changed: a Topic's Secrets
            # are read again every secret_refresh_s, and a PUT each time for each Topic
            # would be most of an idle replica's gateway requests. The queue keeps the
            # shards it was written with.
            return old.shards if old is not None else (delivery.shards if delivery else 11)
        shards = delivery.shards if delivery else 11
        limits = QueueLimits(
            max_entries=delivery.max_queue_entries if delivery else QueueLimits.max_entries,
            max_bytes=delivery.max_queue_bytes if delivery else QueueLimits.max_bytes,
            reservation_timeout_s=self._reservation_timeout_s,
        )
        await self._store.create(queue, shards, limits)
        if (kept := self._dead_letter_limits(spec)) is not None:
            await self._store.create(dead_letter_queue(queue), DEAD_LETTER_SHARDS, kept)
        return shards

    def _dead_letter_limits(self, spec: TopicSpec) -> QueueLimits | None:
        settings = spec.delivery.dead_letters if spec.delivery else None
        if settings is None or not settings.keep:
            return None
        return QueueLimits(
            max_entries=settings.max_entries,
            max_bytes=settings.max_bytes,
            reservation_timeout_s=self._reservation_timeout_s,
        )

    def _open_endpoint(
        self, name: str, spec: TopicSpec, inputs: EndpointInputs
    ) -> tuple[Endpoint | None, tuple[str, str] | None]:
        """The endpoint, or what keeps it from opening as specified (and the reason)."""
        if inputs.credentials is not None and not self._allow_cleartext:
            refusal = broker_cleartext_refusal(spec)
            if refusal is not None:
                return None, (refusal, "CleartextCredentials")
        try:
            return (
                open_endpoint(
                    spec.endpoint,
                    endpoint_topic=endpoint_topic_name(name, spec),
                    credentials=inputs.credentials,
                    ca_pem=inputs.ca_pem,
                    client=inputs.client,
                ),
                None,
            )
        except ConfigurationError as exc:
            return None, (str(exc), "EndpointInvalid")

    async def _delete(self, queue: QueueName, lost: str) -> None:
        """Delete ``queue``; what it still held is said with ``lost`` (a %d format)."""
        with contextlib.suppress(LookupError):
            stats = await self._store.stats(queue, time.time())
            if stats.entries:
                log.warning(lost, stats.entries)
        await self._store.delete(queue)
        self.stored.discard(queue)

    async def retire(self, key: TopicKey, *, reason: str, dead_letters: bool = False) -> None:
        """Stop serving ``key`` and delete its queue (counting what was still in it), and
        with ``dead_letters`` (its Topic is gone) its dead-letter queue too."""
        runtime = self.topics.pop(key, None)
        self.ingest_topics.pop(key, None)
        queue = QueueName(*key)
        if runtime is not None:
            await self._runner.release(queue)
            if runtime.endpoint is not None:
                await runtime.endpoint.aclose()
        await self._delete(queue, f"queue {queue} deleted ({reason}): %d events lost")
        if dead_letters:
            await self._delete(
                dead_letter_queue(queue), f"dead letters of {queue} deleted ({reason}): %d"
            )
        self.metrics.remove_topic(*key)
        self.events.forget(*key)
        self.health.forget(queue)
        log.info("queue %s deleted: %s", queue, reason)
