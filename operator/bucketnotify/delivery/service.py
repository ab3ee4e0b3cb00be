"""The delivery service process: ingest, queue processing and Lease ownership together.

Topics: listed every ``refresh_interval_s`` (a watch would react faster; a list every few
seconds is enough for Topics, which change rarely), and looked up at once when the gateway
pushes for one not seen yet. The Secrets a Topic uses (ingest token, broker credentials,
CA bundle) are read when the Topic is new or changed and again every
``secret_refresh_s``, not on every list: a thousand Topics must not cost a thousand Secret
reads every few seconds.

Processing: one task per owned (queue, shard). A shard whose round left entries behind (a
failed push, a retry time not reached) is polled again after ``round_interval_s``, backing
off to ``idle_max_s`` while its entries all wait for a retry; one found empty, or whose
round delivered everything it listed, is not polled at all (every poll of the S3 store is a
LIST request, and hundreds of idle shards would keep the gateway busy): it waits to be
woken. An ingest commit wakes the shard's task at once, on this replica directly and on the
replica owning the shard by a wake-up request (``delivery.wakeups``). A shard just taken is
polled for ``HANDOVER_POLL_ROUNDS`` renew intervals first, while the other replicas may
still wake its previous holder. A lost wake-up is caught by the survey: every
``stats_interval_s`` the owner of a queue's shard 0 looks at the whole queue (one LIST on
the S3 store) and wakes every shard holding entries; every ``OWN_SURVEY_EVERY`` surveys each
replica also looks at the queues where it owns other shards, in case its peers cannot reach
it. So an event waits for its owner no longer than a wake-up takes, at worst
``stats_interval_s``, and ``OWN_SURVEY_EVERY`` times that when the replicas cannot reach
each other.

Lifecycle of a queue:
- a persistent Topic gets its queue (``create`` is idempotent, so every replica does it);
- a Topic that stops being persistent keeps being delivered from its queue until the queue
  is empty at two sweeps in a row, then the queue is deleted: switching modes loses
  nothing;
- a deleted Topic takes its queue with it (pending events are counted lost, as
  ``radosgw-admin topic rm`` does); so do queues left in the store by Topics deleted while
  no replica ran.
- expired reservations (a writer crashed between reserve and commit) are reclaimed by the
  owner of the queue's shard 0 when its survey finds them.

Metrics (``bucketnotify.metrics``, served on the ingest's ``GET /metrics``): counted from
each round's ``RoundResult`` and around each push wave; a queue's length and size come from
the survey every ``stats_interval_s`` and are exported only by the owner of its shard 0, so
a sum over replicas counts each queue once.

Delivery records (``delivery.recording``): the ingest's commits and each round's
``RoundResult.outcomes`` go to the ``Recorder``, the same results the metrics count.

Kubernetes Events on the Topics (``delivery.events``): told about every round, endpoint
(re)open and ingest 503; they decide the transitions and post in the background.

An endpoint that cannot be opened as specified (missing credentials or CA, an unsupported
SASL mechanism) does not stop the ingest: events wait in the queue until the Topic or its
Secret is fixed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Self

from aiohttp import web

from bucketnotify.api.common import GROUP, VERSION
from bucketnotify.api.topic import (
    INGEST_TOKEN_KEY,
    PREVIOUS_TOKEN_KEY,
    TopicSpec,
    broker_cleartext_refusal,
    endpoint_topic_name,
    ingest_token_secret,
)
from bucketnotify.apiserver import ApiClient, ApiError, log_retried, object_path
from bucketnotify.delivery.direct import ShardGate
from bucketnotify.delivery.endpoints.base import Delivery, Endpoint, PushOutcome, object_of
from bucketnotify.delivery.endpoints.errors import ConfigurationError
from bucketnotify.delivery.endpoints.factory import open_endpoint
from bucketnotify.delivery.events import COMPONENT, TopicEvents
from bucketnotify.delivery.ingest import Ingest, IngestTopic, build_app
from bucketnotify.delivery.ownership import Ownership, partition_of
from bucketnotify.delivery.queue import Entry, QueueLimits, QueueName, QueueStore, shard_of
from bucketnotify.delivery.recording import Recorder
from bucketnotify.delivery.wakeups import WAKE_PATH, WakeUps, parse_wake
from bucketnotify.delivery.worker import (
    LIST_BATCH,
    DeadLetterSink,
    DeliveredCache,
    DeliveryPolicy,
    EventOutcome,
    RoundCutShort,
    RoundResult,
    judge,
    process_shard,
)
from bucketnotify.event_recorder import EventRecorder
from bucketnotify.gateway.errors import GatewayServerError, GatewayUnreachable
from bucketnotify.kube import Kube, SecretMissing
from bucketnotify.metrics import DeliveryMetrics
from bucketnotify.records import Outcome

__all__ = ["DeliveryService", "ServiceTimings", "TopicRuntime"]

log = logging.getLogger(__name__)

TopicKey = tuple[str, str]

TOKEN_RECHECK_S = 1.0
TOKEN_READ_TIMEOUT_S = 5.0

DELIVERED_KEPT = 2048
"""Identities of the events a shard delivered last, kept in the store for its next owner:
what the gateway sends again after a shard moved is then recognised (a duplicate removed,
not pushed)."""
DELIVERED_SAVE_S = 2.0
"""How often a busy shard saves them (and when its loop ends): a replica that dies loses
at most this long of them."""


@dataclass(frozen=True)
class ServiceTimings:
    refresh_interval_s: float = 3.0
    """How often the persistent Topics are listed."""
    secret_refresh_s: float = 30.0
    """How often the Secrets of a known, unchanged Topic are read again."""
    token_overlap_s: float = 600.0
    """How long a replaced ingest token is still taken: the gateway pushes with it until the
    operator has rewritten the gateway topic (seconds, or longer while the operator is
    down)."""
    round_interval_s: float = 0.2
    """Poll interval of a shard that had work."""
    idle_max_s: float = 1.0
    """Longest poll interval of a shard whose entries all wait for their retry time (an
    empty shard is not polled: it is woken)."""
    sweep_interval_s: float = 30.0
    """How often orphaned or drained queues are deleted."""
    reservation_timeout_s: float = QueueLimits.reservation_timeout_s
    """A reservation not committed for this long (its writer died) is reclaimed."""
    drain_timeout_s: float = 3.0
    """How long a hand-back or a shutdown waits for running rounds to finish. A hand-back
    waits inside the Lease round, so this must stay below renew deadline - renew interval
    (8 - 3 s by default), or the replica would fence itself meanwhile."""
    stats_interval_s: float = 30.0
    """How often the owner of a queue's shard 0 surveys the queue (one LIST on the S3
    store): the length and size gauges, expired reservations reclaimed, and shards with
    entries woken, which bounds how long a lost wake-up delays an event."""


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
    delivered: dict[int, DeliveredCache] = field(default_factory=dict)
    delivered_saved: dict[int, tuple[int, float]] = field(default_factory=dict)
    """Per shard: ``DeliveredCache.added`` at the last save to the store, and when."""
    endpoint_kind: str | None = None
    """http, amqp or kafka (for delivery records)."""
    uid: str = ""
    """The Topic object's uid: a Topic deleted and made again under its name is new."""


def _fingerprint(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _settled(result: RoundResult) -> bool:
    """The round left nothing of what it listed (every entry delivered or dropped), and
    listed less than a full batch: the shard was empty when the round ended, but for what
    was committed since."""
    done = result.delivered + result.duplicates + result.expired + result.dead_lettered
    return not result.fenced and result.listed < LIST_BATCH and done == result.listed


class _Metered:
    """An endpoint that counts its pushes in flight and times its push waves."""

    def __init__(self, endpoint: Endpoint, metrics: DeliveryMetrics, queue: QueueName) -> None:
        self._endpoint = endpoint
        self._pending = metrics.push_pending.labels(queue.namespace, queue.topic)
        self._seconds = metrics.push_seconds.labels(queue.namespace, queue.topic)

    async def send(self, batch: Sequence[Delivery]) -> list[PushOutcome]:
        self._pending.inc(len(batch))
        started = time.perf_counter()
        try:
            return await self._endpoint.send(batch)
        finally:
            self._pending.dec(len(batch))
            took = time.perf_counter() - started
            for _ in batch:
                self._seconds.observe(took)

    async def aclose(self) -> None:
        await self._endpoint.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


DRAINED_SWEEPS = 2
"""A draining queue is deleted when this many sweeps in a row found it empty."""

OWN_SURVEY_EVERY = 4
"""Every this many surveys a replica also looks at the queues whose shard 0 another owns,
for its own shards (see ``DeliveryService.survey``)."""

HANDOVER_POLL_ROUNDS = 2
"""A shard this replica has just taken is polled every ``idle_max_s`` (and once more at the
end), not left to wait for wake-ups, for this many Lease renew intervals: the other
replicas' view of who holds it is as old as their last Lease round (one renew interval, and
a round may wait for a hand-back's drain), and what they commit before they see the change
wakes the previous holder, or nobody."""

# How long a Topic the API server did not have is not asked for again.
MISS_TTL_S = 1.0

LIST_CONCURRENCY = 8
"""Namespaces listed at once by a refresh (a replica scoped to 200 lists each of them)."""
CACHED = {"resourceVersion": "0"}
"""A refresh's lists are answered from the API server's watch cache, not by a quorum read of
etcd: a replica scoped to many namespaces lists each every few seconds, and a Topic newer
than the cache is looked up by its first event anyway (``resolve``)."""
UNLISTED_WARN_EVERY_S = 60.0
"""How often a namespace whose Topics cannot be listed is named in a WARNING."""


class DeliveryService:
    MAX_MISSES = 10_000
    """Unknown Topics remembered (each a recent lookup that found nothing)."""

    def __init__(
        self,
        *,
        api: ApiClient,
        store: QueueStore,
        ownership: Ownership,
        namespaces: list[str],
        timings: ServiceTimings = ServiceTimings(),
        metrics: DeliveryMetrics | None = None,
        recorder: Recorder | None = None,
        events: TopicEvents | None = None,
        allow_cleartext_secrets: bool = False,
        direct: bool = False,
    ) -> None:
        self.metrics = metrics if metrics is not None else DeliveryMetrics()
        self._allow_cleartext = allow_cleartext_secrets
        self._recorder = recorder
        """Delivery records of the ingest's commits and of every round (never raises)."""
        self._api = api
        self._kube = Kube(api)
        self._store = store
        self._ownership = ownership
        ownership.before_release = self.before_release
        self._namespaces = namespaces
        self.timings = timings
        self.topics: dict[TopicKey, TopicRuntime] = {}
        self.ingest_topics: dict[TopicKey, IngestTopic] = {}
        self.ingest = Ingest(
            store,
            self.ingest_topics,
            self.resolve,
            self._wake,
            self.metrics,
            recorder,
            recheck=self.recheck_token,
            direct=self if direct else None,
        )
        # Unknown Topics looked up recently: a stray or hostile sender must not turn every
        # request into an API server call.
        self._misses: dict[TopicKey, float] = {}
        self._unlisted_warned: dict[str, float] = {}
        self._token_reads: dict[TopicKey, asyncio.Task[None]] = {}
        """Token Secret reads under way (``recheck_token``), one per Topic at most."""
        self._lock = asyncio.Lock()
        self._loops: dict[tuple[QueueName, int], asyncio.Task[None]] = {}
        self._wakes: dict[tuple[QueueName, int], asyncio.Event] = {}
        self._stopping = False
        self._loaded = False
        """The Topic table was read once: until then each request costs an API call."""
        self._stop: asyncio.Event | None = None
        self._stored: set[QueueName] = set()
        """Queues the store held at the last sweep (finds queues to drain after a restart)."""
        self.events = events or TopicEvents(
            EventRecorder(api, component=COMPONENT, instance=ownership.identity)
        )
        """Kubernetes Events on the Topics (delivery.events)."""
        self._wakeups = WakeUps(ownership.owner_address, self.metrics)
        self._surveys = 0
        self.gate = ShardGate()
        """Order between the ingest's direct pushes, commits and rounds (``direct``)."""
        self._saves: dict[tuple[QueueName, int], asyncio.TimerHandle] = {}
        """Shards whose directly delivered identities are to be saved (``_save_soon``)."""
        self._saving: set[asyncio.Task[None]] = set()
        self._direct_failed: dict[tuple[QueueName, int, str], EventOutcome] = {}
        """Failed direct pushes of events being committed, recorded once they are."""

    def app(self) -> web.Application:
        app = build_app(self.ingest, self.unready)
        app.middlewares.append(self.events.ingest_middleware)
        app.router.add_post(WAKE_PATH, self._on_wake)
        return app

    async def _on_wake(self, request: web.Request) -> web.Response:
        """Another replica committed to shards this one may own (``delivery.wakeups``)."""
        try:
            shards = parse_wake(await request.json())
        except ValueError:
            shards = None
        if shards is None:
            return web.Response(status=400, text='expected {"shards": [[namespace, topic, n]]}')
        self.metrics.wakeups_received.inc(len(shards))
        for queue, shard in shards:
            self._wake_local(queue, shard)
        return web.Response(status=204)

    def unready(self) -> str | None:
        """Why a Service should not send this replica requests now, or None.

        Not before the first read of the Topics (a request would wait for its own lookup,
        while the gateway's sync push is waiting), and not once stopping (the Service
        takes the replica out before it goes)."""
        if self._stop is not None and self._stop.is_set():
            return "stopping"
        if not self._loaded:
            return "the Topics were not read yet"
        if not self._ownership.joined:
            return "its member Lease was not written yet"
        return None

    # --- Topics ---------------------------------------------------------------------------

    def _in_scope(self, namespace: str) -> bool:
        return not self._namespaces or namespace in self._namespaces

    async def _list_topics(self) -> tuple[list[dict[str, Any]], set[str]]:
        """The Topics in scope, and the namespaces whose list failed.

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
        if not self._in_scope(namespace):
            return None
        if time.monotonic() - self._misses.get(key, -1e9) < MISS_TTL_S:
            return None
        async with self._lock:
            if key not in self.ingest_topics:
                try:
                    topic = await self._api.get(
                        object_path(GROUP, VERSION, "topics", namespace, name)
                    )
                    await self._consider(topic)
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

    async def refresh(self) -> None:
        """Bring the Topic table in line with the Topics that exist now."""
        seen: set[TopicKey] = set()
        async with self._lock:
            listed, unlisted = await self._list_topics()
            for topic in listed:
                meta = topic["metadata"]
                seen.add((meta["namespace"], meta["name"]))
                try:
                    await self._consider(topic)
                except Exception:
                    # One broken Topic must not keep the others from being served.
                    log.exception("cannot serve topic %s/%s", meta["namespace"], meta["name"])
        for key in set(self.topics) - seen:
            if key[0] not in unlisted:
                await self._retire(key, reason="its Topic was deleted")
        # Drop the ingest of Topics the list no longer shows even without a runtime.
        for key in set(self.ingest_topics) - seen:
            if key[0] not in unlisted:
                self.ingest_topics.pop(key, None)

    async def _consider(self, topic: dict[str, Any]) -> None:
        meta = topic["metadata"]
        key: TopicKey = (meta["namespace"], meta["name"])
        spec = TopicSpec.model_validate(topic["spec"])
        generation = int(meta.get("generation") or 0)
        uid = str(meta.get("uid") or "")
        current = self.topics.get(key)
        queue = QueueName(*key)
        if not spec.persistent:
            self.ingest_topics.pop(key, None)
            if current is None and queue not in self._stored:
                return
            # It was persistent: what is queued still goes out, then the queue goes.
            if current is None or current.generation != generation:
                await self._open(key, spec, generation, uid, draining=True)
            return
        due = (
            current is None
            or current.generation != generation
            or current.draining
            # Its token Secret did not exist yet (the operator creates it as the Topic gets
            # Ready): look again now, not a secret_refresh_s later, or the ingest answers 404.
            or key not in self.ingest_topics
            or time.monotonic() - current.secrets_read_at > self.timings.secret_refresh_s
        )
        if not due:
            return
        started = time.monotonic()
        tokens = await self._read_tokens(key)
        await self._open(key, spec, generation, uid, draining=False)
        runtime = self.topics[key]
        self._set_tokens(key, runtime.queue, runtime.shards, tokens, started)

    async def _read_tokens(self, key: TopicKey) -> dict[str, str]:
        try:
            return await self._kube.secret_data(key[0], ingest_token_secret(key[1]))
        except SecretMissing:
            return {}  # the operator has not created it yet

    def _set_tokens(
        self,
        key: TopicKey,
        queue: QueueName,
        shards: int,
        secret: dict[str, str],
        read_at: float,
    ) -> None:
        """Take the token Secret's data, read from ``read_at`` (monotonic, when the read
        began: a push that came before then is answered by it)."""
        token = secret.get(INGEST_TOKEN_KEY)
        old = self.ingest_topics.get(key)
        if not token and old is not None:
            # The Secret was deleted and the operator is making it again with a new token:
            # until the gateway topic has that one, the gateway pushes with the token held
            # here, and with hand-off sync a refused push is an event lost.
            self.ingest_topics[key] = replace(old, queue=queue, shards=shards, read_at=read_at)
            return
        if not token:
            return
        now = time.monotonic()
        replaced, until = None, 0.0
        if old is not None and old.token != token:
            replaced, until = old.token, now + self.timings.token_overlap_s
            log.info("the ingest token of topic %s/%s was rotated", *key)
        elif old is not None:
            replaced, until = old.replaced, old.replaced_until
        self.ingest_topics[key] = IngestTopic(
            queue,
            token,
            shards,
            previous=secret.get(PREVIOUS_TOKEN_KEY) or None,
            replaced=replaced,
            replaced_until=until,
            read_at=read_at,
        )

    async def recheck_token(
        self, namespace: str, name: str, since: float | None = None
    ) -> IngestTopic | None:
        """The Topic as a read of its token Secret begun at or after ``since`` (monotonic;
        default now) found it: a push came at ``since`` with a token this replica does not
        hold.

        The operator writes the Secret before it gives the gateway the token, so such a read
        sees every token the gateway can push with. Reads are one a second per Topic at
        most (a sender guessing tokens costs few API calls); a push that comes within the
        second waits for the next read instead of being refused, and pushes that come
        together share one read: after a rotation the gateway sends many with the new token
        at once, and with hand-off sync a refused push is an event lost."""
        key = (namespace, name)
        since = time.monotonic() if since is None else since
        while True:
            current = self.ingest_topics.get(key)
            if current is None or current.read_at >= since:
                return current
            read = self._token_reads.get(key)
            if read is None or read.done():
                read = asyncio.create_task(
                    self._reread_tokens(key, not_before=current.read_at + TOKEN_RECHECK_S)
                )
                self._token_reads[key] = read
                read.add_done_callback(
                    lambda done: (
                        self._token_reads.pop(key, None)
                        if self._token_reads.get(key) is done
                        else None
                    )
                )
            # A read under way that began before ``since`` may miss the token: then the
            # loop waits for the next one.
            await asyncio.shield(read)

    async def _reread_tokens(self, key: TopicKey, not_before: float) -> None:
        await asyncio.sleep(max(0.0, not_before - time.monotonic()))
        started = time.monotonic()
        try:
            # Bounded: the pushes waiting for it must not hang on an API server that does
            # not answer (the gateway's own push timeout would then decide).
            async with asyncio.timeout(TOKEN_READ_TIMEOUT_S):
                secret = await self._read_tokens(key)
        except Exception as exc:  # the API server unreachable: answer with what is known
            log.warning("cannot read the ingest token of topic %s/%s: %s", *key, exc)
            current = self.ingest_topics.get(key)
            if current is not None:
                self.ingest_topics[key] = replace(current, read_at=started)
            return
        latest = self.ingest_topics.get(key)
        if latest is not None:  # not retired meanwhile
            self._set_tokens(key, latest.queue, latest.shards, secret, started)

    async def _endpoint_inputs(
        self, namespace: str, spec: TopicSpec
    ) -> tuple[tuple[str, str] | None, str | None]:
        endpoint = spec.endpoint
        credentials = None
        ref = (endpoint.amqp and endpoint.amqp.credentials_ref) or (
            endpoint.kafka and endpoint.kafka.sasl and endpoint.kafka.sasl.credentials_ref
        )
        if ref:
            data = await self._kube.secret_data(namespace, ref.secret_name)
            for secret_key in (ref.username_key, ref.password_key):
                if secret_key not in data:
                    raise SecretMissing(
                        f"Secret {namespace}/{ref.secret_name} has no key {secret_key!r}"
                    )
            credentials = (data[ref.username_key], data[ref.password_key])
        ca_ref = (
            (endpoint.http and endpoint.http.ca_ref)
            or (endpoint.amqp and endpoint.amqp.ca_ref)
            or (endpoint.kafka and endpoint.kafka.ca_ref)
        )
        ca_pem = await self._kube.ca_bundle(namespace, ca_ref) if ca_ref else None
        return credentials, ca_pem

    async def _open(
        self, key: TopicKey, spec: TopicSpec, generation: int, uid: str, *, draining: bool
    ) -> None:
        namespace, name = key
        delivery = spec.delivery
        shards = delivery.shards if delivery else 11
        limits = QueueLimits(
            max_entries=delivery.max_queue_entries if delivery else QueueLimits.max_entries,
            max_bytes=delivery.max_queue_bytes if delivery else QueueLimits.max_bytes,
            reservation_timeout_s=self.timings.reservation_timeout_s,
        )
        queue = QueueName(namespace, name)
        old = self.topics.get(key)
        if not draining and (
            old is None or old.generation != generation or old.uid != uid or old.draining
        ):
            # Only when the queue may be new or its settings changed: a Topic's Secrets
            # are read again every secret_refresh_s, and a PUT each time for each Topic
            # would be most of an idle replica's gateway requests.
            await self._store.create(queue, shards, limits)
        elif old is not None:
            shards = old.shards  # the queue keeps the shards it was written with
        endpoint: Endpoint | None = None
        problem: str | None = None
        problem_reason = ""
        try:
            credentials, ca_pem = await self._endpoint_inputs(namespace, spec)
            fingerprint = _fingerprint(
                spec.model_dump(), credentials, ca_pem, generation, shards, draining
            )
        except SecretMissing as exc:
            problem, problem_reason = str(exc), "SecretNotFound"
            fingerprint = _fingerprint(problem, generation, draining)
        if old is not None and old.fingerprint == fingerprint and old.uid == uid:
            old.secrets_read_at = time.monotonic()
            return
        if problem is None and credentials is not None and not self._allow_cleartext:
            refusal = broker_cleartext_refusal(spec)
            if refusal is not None:
                problem, problem_reason = refusal, "CleartextCredentials"
        if problem is None:
            try:
                endpoint = open_endpoint(
                    spec.endpoint,
                    endpoint_topic=endpoint_topic_name(name, spec),
                    credentials=credentials,
                    ca_pem=ca_pem,
                )
            except ConfigurationError as exc:
                problem, problem_reason = str(exc), "EndpointInvalid"
        if problem is not None and (old is None or old.problem != problem):
            # Events keep being accepted and wait in the queue until this is fixed.
            log.error("topic %s/%s: not delivering: %s", namespace, name, problem)
        self.events.endpoint_state(namespace, name, problem, problem_reason)
        self.topics[key] = TopicRuntime(
            queue=queue,
            shards=shards,
            policy=DeliveryPolicy(
                time_to_live_s=spec.time_to_live or 0,
                max_retries=spec.max_retries or 0,
                retry_sleep_s=spec.retry_sleep_duration or 0,
            ),
            endpoint=endpoint,
            fingerprint=fingerprint,
            generation=generation,
            secrets_read_at=time.monotonic(),
            problem=problem,
            draining=draining,
            dead_letter=delivery.dead_letter_topic if delivery else None,
            delivered=old.delivered if old is not None else {},
            endpoint_kind=spec.endpoint.kind,
            uid=uid,
        )
        self.metrics.add_topic(namespace, name)
        if old is not None:
            # The old runtime's loops finish their round and end; new ones start with the
            # new endpoint at the next supervision.
            await self._wait_loops(self._units_of(queue))
            if old.endpoint is not None:
                await old.endpoint.aclose()
        log.info(
            "%s topic %s/%s (%d shards)",
            "draining" if draining else "serving",
            namespace,
            name,
            shards,
        )

    async def _retire(self, key: TopicKey, *, reason: str) -> None:
        """Stop serving ``key`` and delete its queue (counting what was still in it)."""
        runtime = self.topics.pop(key, None)
        self.ingest_topics.pop(key, None)
        queue = QueueName(*key)
        if runtime is not None:
            await self._wait_loops(self._units_of(queue))
            if runtime.endpoint is not None:
                await runtime.endpoint.aclose()
        with contextlib.suppress(LookupError):
            stats = await self._store.stats(queue, time.time())
            if stats.entries:
                log.warning("queue %s deleted (%s): %d events lost", queue, reason, stats.entries)
        await self._store.delete(queue)
        self._stored.discard(queue)
        self.metrics.remove_topic(*key)
        self.events.forget(*key)
        log.info("queue %s deleted: %s", queue, reason)

    async def sweep(self) -> None:
        """Delete drained and orphaned queues."""
        now = time.time()
        self._stored = set(await self._store.queues())
        for key, runtime in list(self.topics.items()):
            if not self._ownership.owns_shard(runtime.queue, 0):
                continue
            if runtime.draining:
                stats = await self._store.stats(runtime.queue, now)
                if stats.entries or stats.reservations:
                    runtime.empty_sweeps = 0
                    continue
                # Empty twice in a row, a sweep interval apart: another replica that had
                # not seen the change yet (it lists the Topics every few seconds) may still
                # have been committing to it at the first look, and an S3 store's commit
                # far below the bounds leaves no reservation marker to see.
                runtime.empty_sweeps += 1
                if runtime.empty_sweeps >= DRAINED_SWEEPS:
                    await self._retire(key, reason="its Topic is no longer persistent")
        # Queues of Topics deleted while no replica was running.
        orphans = {
            q
            for q in self._stored
            if self._in_scope(q.namespace) and (q.namespace, q.topic) not in self.topics
        }
        for queue in orphans:
            if await self._kube.get_object("topics", queue.namespace, queue.topic) is None:
                await self._retire((queue.namespace, queue.topic), reason="its Topic is gone")

    async def survey(self) -> None:
        """Look at each queue whose shard 0 this replica owns, once (``QueueStore.glance``):
        set its gauges, reclaim expired reservations, wake the shards holding entries (a
        wake-up may have been lost). Drop the gauges of the other queues (their owner
        exports them). Queues where it owns other shards only it looks at every
        ``OWN_SURVEY_EVERY`` surveys, for its own shards: a wake-up from the shard-0 owner
        can be lost too (a network policy that keeps the replicas apart)."""
        self.metrics.partitions_owned.labels(self._ownership.identity).set(
            len(self._ownership.owned())
        )
        self._surveys += 1
        own_turn = self._surveys % OWN_SURVEY_EVERY == 0
        for key, runtime in list(self.topics.items()):
            queue = runtime.queue
            lead = self._ownership.owns_shard(queue, 0)
            if not lead:
                self.metrics.drop_queue_stats(*key)
                owned = any(self._ownership.owns_shard(queue, s) for s in range(runtime.shards))
                if not (own_turn and owned):
                    continue
            now = time.time()
            try:
                stats = await self._store.glance(queue, now)
            except LookupError:
                continue
            for shard, held in stats.shards.items():
                if held.entries:
                    if lead:
                        self._wake(queue, shard)
                    elif self._ownership.owns_shard(queue, shard):
                        self._wake_local(queue, shard)
            if not lead:
                continue
            self.metrics.set_queue_stats(*key, stats.entries, stats.bytes)
            if stats.expired:
                reclaimed = await self._store.reclaim(queue, now)
                if reclaimed:
                    log.warning("%s: reclaimed %d abandoned reservations", queue, reclaimed)

    # --- direct delivery (delivery.direct) ---------------------------------------------------

    def allowed(self, queue: QueueName, shard: int) -> bool:
        # Another replica's commit to the shard would reach this owner only by a wake-up,
        # after the gateway has its answer: a later event of the object pushed directly
        # meanwhile would overtake it. So only while this replica is the only member.
        loop = self._loops.get((queue, shard))
        return (
            not self._stopping
            and self._ownership.members == 1
            and loop is not None
            and not loop.done()
            and self._ownership.owns_shard(queue, shard)
        )

    async def push(
        self,
        queue: QueueName,
        shard: int,
        record: dict[str, Any],
        event_id: str,
        body: bytes,
        ingest_time: float,
    ) -> bool:
        runtime = self.topics.get((queue.namespace, queue.topic))
        if runtime is None or runtime.queue != queue or runtime.endpoint is None:
            return False
        delivered = runtime.delivered.setdefault(shard, DeliveredCache())
        entry = Entry(id=event_id, event_id=event_id, body=body, ingest_time=ingest_time)
        result = RoundResult(listed=1)
        if event_id in delivered:
            # The gateway sent it again (or retried a request it had no answer to).
            result.duplicates = 1
            result.outcomes.append(EventOutcome(Outcome.DUPLICATE, entry, record, 0, time.time()))
        else:
            endpoint = _Metered(runtime.endpoint, self.metrics, queue)
            (outcome,) = await endpoint.send([Delivery(entry.id, record, body)])
            verdict = judge(entry, record, outcome, time.time())
            if verdict.outcome is Outcome.DELIVERED:
                result.delivered = 1
                result.latencies.append(verdict.at - ingest_time)
                delivered.add(event_id)
                result.outcomes.append(verdict)
                self._save_soon(runtime, shard, delivered)
            elif verdict.outcome is Outcome.FAILED or not await self._drop(
                runtime, verdict, result
            ):
                # Recorded once it is queued (``queued``), with the ingest time it gets there.
                result.failed = 1
                if verdict.error:
                    result.errors.append(verdict.error)
                self._direct_failed[(queue, shard, event_id)] = replace(
                    verdict, outcome=Outcome.FAILED
                )
        self._count(queue, result)
        self.events.round_done(queue, result)
        if self._recorder is not None and result.outcomes:
            self._recorder.round(queue, shard, runtime.endpoint_kind, result)
        if result.delivered or result.duplicates:
            self.metrics.events_direct.labels(queue.namespace, queue.topic).inc()
        if result.expired:
            _log_lost(queue, shard, result)
        if result.failed:
            log.info(
                "%s shard %d: direct push failed, queueing the event: %s",
                queue,
                shard,
                result.errors[0] if result.errors else "no acknowledgement",
            )
        return not result.failed

    async def _drop(
        self, runtime: TopicRuntime, refused: EventOutcome, result: RoundResult
    ) -> bool:
        """A direct push that retrying cannot help: the event goes to the dead-letter topic,
        or is lost, as a round would drop it; False when the dead-letter topic refuses it
        (then it is queued, and the rounds offer it again)."""
        sink = self._dead_letter_sink(runtime)
        if sink is None:
            result.expired = 1
            dropped = Outcome.REJECTED
        else:
            try:
                await sink([refused.entry])
            except Exception as exc:
                log.warning(
                    "%s: dead-letter topic refused an undeliverable event, queueing it: %s",
                    runtime.queue,
                    exc,
                )
                return False
            result.dead_lettered = 1
            dropped = Outcome.DEAD_LETTERED
        result.rejected = 1
        if refused.error:
            result.errors.append(refused.error)
        result.outcomes.append(replace(refused, outcome=dropped, at=time.time()))
        return True

    async def queued(self, queue: QueueName, shard: int, event_id: str, committed: bool) -> None:
        failed = self._direct_failed.pop((queue, shard, event_id), None)
        runtime = self.topics.get((queue.namespace, queue.topic))
        if failed is None or not committed or runtime is None or runtime.queue != queue:
            return  # no push was made (no endpoint), or nothing was queued
        try:
            entries = await self._store.list(queue, shard, LIST_BATCH)
            found = [e for e in entries if e.event_id == event_id and not e.attempts]
            if not found:
                return
            # As a round would have written it back: maxRetries and retrySleepDuration count
            # the direct push.
            entry = replace(
                found[-1], attempts=1, not_before=time.time() + runtime.policy.retry_sleep_s
            )
            await self._store.update(queue, shard, [entry])
            self.metrics.push_retries.labels(queue.namespace, queue.topic).inc()
        except Exception as exc:
            log.warning(
                "%s shard %d: the failed direct push of a queued event is not counted as an"
                " attempt (it gets one more): %s",
                queue,
                shard,
                exc,
            )
            return
        if self._recorder is not None:
            # Dated when queued: a record's outcome never comes before its ingest time.
            queued = replace(failed, entry=entry, at=max(failed.at, entry.ingest_time))
            self._recorder.round(
                queue, shard, runtime.endpoint_kind, RoundResult(outcomes=[queued])
            )

    def _save_soon(self, runtime: TopicRuntime, shard: int, delivered: DeliveredCache) -> None:
        """Save the shard's delivered identities within ``DELIVERED_SAVE_S``: its loop,
        asleep while events go directly, would not until its next round."""
        unit = (runtime.queue, shard)
        if unit in self._saves:
            return

        def due() -> None:
            del self._saves[unit]
            task = asyncio.create_task(self._save_delivered(runtime, shard, delivered, final=True))
            self._saving.add(task)
            task.add_done_callback(self._saving.discard)

        self._saves[unit] = asyncio.get_running_loop().call_later(DELIVERED_SAVE_S, due)

    # --- processing -----------------------------------------------------------------------

    def _wake(self, queue: QueueName, shard: int) -> None:
        """The shard has entries: its task here starts a round, or its owner is told."""
        self._wake_local(queue, shard)
        if not self._ownership.owns_shard(queue, shard):
            self._wakeups.send(queue, shard)

    def _wake_local(self, queue: QueueName, shard: int) -> None:
        event = self._wakes.get((queue, shard))
        if event is not None:
            event.set()

    def _supervise(self) -> None:
        """Start a loop for every owned shard that has none; loops end by themselves."""
        for done in [k for k, task in self._loops.items() if task.done()]:
            del self._loops[done]
            self.gate.forget(done)  # a loop that failed or was cancelled did not say so
        if self._stopping:
            return
        if self._ownership.changed.is_set():
            self._ownership.changed.clear()
            # An empty shard's task sleeps until woken: one whose shard moved away must
            # wake to end, or a later take-back would find it still there, asleep.
            for unit in self._loops:
                if not self._ownership.owns_shard(*unit):
                    self._wake_local(*unit)
        for key, runtime in self.topics.items():
            if runtime.endpoint is None:
                continue
            for shard in range(runtime.shards):
                unit = (runtime.queue, shard)
                if unit not in self._loops and self._ownership.owns_shard(runtime.queue, shard):
                    self._loops[unit] = asyncio.create_task(
                        self._shard_loop(key, shard), name=f"shard {runtime.queue}#{shard}"
                    )

    async def _shard_loop(self, key: TopicKey, shard: int) -> None:
        # Bound to the runtime it started with: a changed Topic gets fresh loops.
        runtime = self.topics[key]
        endpoint = runtime.endpoint
        assert endpoint is not None
        queue = runtime.queue
        wake = self._wakes.setdefault((queue, shard), asyncio.Event())
        delay = self.timings.round_interval_s
        delivered = runtime.delivered.setdefault(shard, DeliveredCache())
        # The other replicas learn that this one holds the shard at their next Lease round:
        # until then their commits wake the previous holder, or nobody. Poll meanwhile.
        awake_until = (
            time.monotonic() + HANDOVER_POLL_ROUNDS * self._ownership.settings.renew_interval_s
        )
        await self._load_delivered(runtime, shard, delivered)
        while not self._stopping:
            if self.topics.get(key) is not runtime or not self._ownership.owns_shard(queue, shard):
                break
            wake.clear()
            result = await self._process(runtime, endpoint, shard)
            await self._save_delivered(runtime, shard, delivered)
            if result is not None and result.listed >= LIST_BATCH and not result.failed:
                continue  # a backlog: go on at once
            if result is not None and _settled(result) and self._ownership.address:
                left = awake_until - time.monotonic()
                if left > 0:
                    await _woken(wake, min(left, self.timings.idle_max_s))
                    delay = self.timings.round_interval_s
                    continue
                # Nothing left that it listed, and nothing committed since the listing (that
                # would have woken it): no polling. A commit, a wake-up, the survey, an
                # ownership or Topic change or the stop wakes it. (Without an address nobody
                # could send this replica wake-ups: it polls, below.)
                await self._idle(runtime, shard, delivered, wake)
                delay = self.timings.round_interval_s
                continue
            progress = result is not None and (
                result.delivered or result.expired or result.dead_lettered or result.duplicates
            )
            if progress:
                delay = self.timings.round_interval_s
            else:
                # Nothing to do, or only failures: poll, and hit the endpoint, less often.
                delay = min(max(delay, self.timings.round_interval_s) * 2, self.timings.idle_max_s)
            await _woken(wake, delay)
            if wake.is_set():
                delay = self.timings.round_interval_s
        self.gate.forget((queue, shard))
        await self._save_delivered(runtime, shard, delivered, final=True)

    async def _idle(
        self, runtime: TopicRuntime, shard: int, delivered: DeliveredCache, wake: asyncio.Event
    ) -> None:
        """Wait to be woken. What the shard delivered is saved first, once the periodic
        save is due: there may be no round to do it for a long time, and a replica killed
        meanwhile would leave its successor to push again what the gateway re-sends. Not at
        once: under light load a shard goes idle after nearly every event."""
        saved, at = runtime.delivered_saved.get(shard, (0, 0.0))
        if delivered.added != saved:
            due = max(0.0, DELIVERED_SAVE_S - (time.monotonic() - at))
            if await _woken(wake, due):
                return
            await self._save_delivered(runtime, shard, delivered, final=True)
        await wake.wait()

    async def _load_delivered(
        self, runtime: TopicRuntime, shard: int, delivered: DeliveredCache
    ) -> None:
        """What the shard's previous owner (or this replica, before) delivered last."""
        try:
            found = await self._store.load_delivered(runtime.queue, shard)
        except Exception as exc:  # a hint: without it, duplicates are possible, not losses
            log.warning("%s shard %d: delivered identities not read: %s", runtime.queue, shard, exc)
            return
        for event_id in found:
            if event_id not in delivered:
                delivered.add(event_id)
        runtime.delivered_saved[shard] = (delivered.added, time.monotonic())

    async def _save_delivered(
        self, runtime: TopicRuntime, shard: int, delivered: DeliveredCache, final: bool = False
    ) -> None:
        saved, at = runtime.delivered_saved.get(shard, (0, 0.0))
        if delivered.added == saved:
            return
        if not final and time.monotonic() - at < DELIVERED_SAVE_S:
            return
        runtime.delivered_saved[shard] = (delivered.added, time.monotonic())
        try:
            await self._store.save_delivered(runtime.queue, shard, delivered.recent(DELIVERED_KEPT))
        except Exception as exc:
            log.warning(
                "%s shard %d: delivered identities not saved: %s", runtime.queue, shard, exc
            )

    async def _process(
        self, runtime: TopicRuntime, endpoint: Endpoint, shard: int
    ) -> RoundResult | None:
        queue = runtime.queue
        mark = await self.gate.round_starts((queue, shard))
        result = await self._round(runtime, endpoint, shard)
        self.gate.round_ended((queue, shard), mark, result is not None and _settled(result))
        return result

    async def _round(
        self, runtime: TopicRuntime, endpoint: Endpoint, shard: int
    ) -> RoundResult | None:
        queue = runtime.queue
        try:
            try:
                result = await process_shard(
                    store=self._store,
                    queue=queue,
                    shard=shard,
                    endpoint=_Metered(endpoint, self.metrics, queue),
                    policy=runtime.policy,
                    delivered=runtime.delivered.setdefault(shard, DeliveredCache()),
                    still_owned=lambda: self._ownership.owns_shard(queue, shard),
                    now=time.time(),
                    dead_letter=self._dead_letter_sink(runtime),
                )
            except RoundCutShort as cut:
                # What the round did before the store failed is counted and recorded once;
                # the next round neither pushes nor counts it again.
                self._account(runtime, shard, cut.result)
                raise cut.cause from None
        except (GatewayUnreachable, GatewayServerError) as exc:
            # The queue store's gateway is away or overloaded: expected in an outage, and the
            # next round tries again. One line, not a traceback per shard and round.
            log.warning("round of %s shard %d: queue store unavailable: %s", queue, shard, exc)
            return None
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                log.exception("round of %s shard %d failed", queue, shard)
                return None
            # The dir store's disk is full: its removals rewrite batch files. What was
            # delivered is remembered and not pushed again; the next round retries.
            log.warning("round of %s shard %d: the queue store is out of space", queue, shard)
            return None
        except Exception:
            log.exception("round of %s shard %d failed", queue, shard)
            return None
        self._account(runtime, shard, result)
        return result

    def _account(self, runtime: TopicRuntime, shard: int, result: RoundResult) -> None:
        """Count, record, announce and log what one round did."""
        queue = runtime.queue
        self._count(queue, result)
        self.events.round_done(queue, result)
        if self._recorder is not None:
            self._recorder.round(queue, shard, runtime.endpoint_kind, result)
        if (
            result.delivered
            or result.failed
            or result.expired
            or result.dead_lettered
            or result.duplicates
        ):
            # A loss is never routine: WARNING, so that it shows where INFO is filtered out.
            # A round that only delivered is: DEBUG (under load there is one per commit; the
            # metrics and delivery records count them).
            unusual = (
                result.failed or result.dead_lettered or result.duplicates or not result.drops_stand
            )
            log.log(
                logging.WARNING
                if result.expired and result.drops_stand
                else logging.INFO
                if unusual or result.expired
                else logging.DEBUG,
                "%s shard %d: delivered %d failed %d lost %d dead-lettered %d duplicates %d%s%s",
                queue,
                shard,
                result.delivered,
                result.failed,
                result.expired,
                result.dead_lettered,
                result.duplicates,
                " (fenced)" if result.fenced else " (cut short)" if result.cut_short else "",
                f"; first error: {result.errors[0]}" if result.errors else "",
            )
        if result.drops_stand:
            _log_lost(queue, shard, result)

    def _count(self, queue: QueueName, result: RoundResult) -> None:
        # Only what is not zero: a round is often one event, and every labels() lookup costs
        # (the series exist from add_topic on, at 0).
        m, labels = self.metrics, (queue.namespace, queue.topic)
        counts = [
            (m.push_ok, result.delivered),
            (m.push_failed, result.failed + result.rejected),
        ]
        if result.drops_stand:  # nothing was dropped, removed or written back otherwise
            counts += [
                (m.push_retries, result.retried),
                (m.event_lost, result.expired),
                (m.event_dead_lettered, result.dead_lettered),
                (m.duplicates, result.duplicates),
            ]
        for counter, count in counts:
            if count:
                counter.labels(*labels).inc(count)
        if result.latencies:
            latency = m.delivery_latency_seconds.labels(*labels)
            for seconds in result.latencies:
                latency.observe(seconds)

    def _dead_letter_sink(self, runtime: TopicRuntime) -> DeadLetterSink | None:
        if runtime.dead_letter is None:
            return None
        key = (runtime.queue.namespace, runtime.dead_letter)

        async def sink(entries: Sequence[Entry]) -> None:
            target = self.topics.get(key)
            if target is None or target.draining:
                raise LookupError(f"{key[0]}/{key[1]} is not a persistent Topic")
            by_shard: dict[int, list[tuple[str, bytes]]] = {}
            for entry in entries:
                shard = shard_of(*object_of(json.loads(entry.body)), target.shards)
                by_shard.setdefault(shard, []).append((entry.event_id, entry.body))
            await self.ingest.commit(target.queue, by_shard)

        return sink

    def _units_of(self, queue: QueueName) -> list[tuple[QueueName, int]]:
        return [u for u in self._loops if u[0] == queue]

    async def _wait_loops(self, units: list[tuple[QueueName, int]]) -> None:
        tasks = [self._loops[u] for u in units if u in self._loops]
        for unit in units:
            self._wake(*unit)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.timings.drain_timeout_s)
            for task in pending:
                # A round stuck on an endpoint: cancelling it before its removals means
                # the next owner sends those entries again (a duplicate, never a loss).
                task.cancel()
            if pending:
                await asyncio.wait(pending)

    async def before_release(self, partition: int) -> None:
        """Ownership hands ``partition`` back: let its running rounds finish first (they
        stop on their own, as the partition is no longer owned)."""
        units = [
            u
            for u in self._loops
            if partition_of(u[0], u[1], self._ownership.settings.partitions) == partition
        ]
        await self._wait_loops(units)

    async def run(self, stop: asyncio.Event) -> None:
        self._stop = stop
        await self._ownership.start()
        last_refresh = last_sweep = last_stats = -1e9
        try:
            while not stop.is_set():
                now = time.monotonic()
                if now - last_refresh > self.timings.refresh_interval_s:
                    try:
                        await self.refresh()
                        self._loaded = True
                    except Exception as exc:
                        log_retried(log, "refreshing the topic table failed", exc)
                    last_refresh = now
                if now - last_sweep > self.timings.sweep_interval_s:
                    try:
                        await self.sweep()
                    except Exception as exc:
                        log_retried(log, "sweeping the queues failed", exc, GATEWAY_AWAY)
                    last_sweep = now
                if now - last_stats > self.timings.stats_interval_s:
                    try:
                        await self.survey()
                    except Exception as exc:
                        log_retried(log, "surveying the queues failed", exc, GATEWAY_AWAY)
                    last_stats = now
                self._supervise()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.timings.round_interval_s)
        finally:
            # Rounds finish their removals before the Leases are handed back, so the next
            # owner starts from what this replica actually delivered.
            self._stopping = True
            await self._wait_loops(list(self._loops))
            # The loops' last saves covered what was delivered directly too.
            for timer in self._saves.values():
                timer.cancel()
            if self._saving:
                await asyncio.wait(self._saving)
            await self._wakeups.aclose()
            await self._ownership.stop(release=True)
            for runtime in self.topics.values():
                if runtime.endpoint is not None:
                    await runtime.endpoint.aclose()
            await self.events.aclose()


GATEWAY_AWAY = (GatewayUnreachable, GatewayServerError)
"""Failures of the queue store on the gateway that its next sweep or survey gets over."""

# Lost events named one by one, up to this many per round; a TTL that expires a backlog
# must not flood the log.
LOST_NAMED = 10


def _log_lost(queue: QueueName, shard: int, result: RoundResult) -> None:
    """One WARNING per event lost this round: its bucket, key (escaped: a key may hold any
    character, a newline included) and why."""
    lost = [o for o in result.outcomes if o.outcome in (Outcome.EXPIRED, Outcome.REJECTED)]
    for outcome in lost[:LOST_NAMED]:
        bucket, key = object_of(outcome.record)
        log.warning(
            "%s shard %d: event lost, bucket %r key %r (%s after %d attempts): %s",
            queue,
            shard,
            bucket,
            key,
            outcome.outcome,
            outcome.attempts,
            outcome.error or "no reason recorded",
        )
    if len(lost) > LOST_NAMED:
        log.warning(
            "%s shard %d: %d more events lost this round", queue, shard, len(lost) - LOST_NAMED
        )


async def _woken(wake: asyncio.Event, timeout_s: float) -> bool:
    """Wait for ``wake`` at most ``timeout_s``; whether it was set. (``asyncio.wait_for``
    would make a task of every wait: one per round of every shard.)"""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await wake.wait()
    return wake.is_set()
