"""The ingest: where the gateway pushes a persistent Topic's events.

``POST /v1/topics/<namespace>/<topic>/<token>`` with the gateway's ``{"Records": [...]}``.
The answer is 2xx only after every record is durably committed to the Topic's queue, or
delivered to its endpoint (``delivery.rounds.direct``: an event for an empty shard, by the shard's
owner, to which another replica hands the request: ``delivery.peers.forwarding``); the gateway
(or, for hand-off ``sync``, the S3 client) sees any other answer as a failure:

- 400 the body is not the gateway's JSON; 413 it is larger than ``max_body_bytes``;
- 404 no such persistent Topic; 403 the token is wrong (compared in constant time). A
  token the replica does not know makes it read the token Secret again first (at most once
  a second per Topic), so a rotated token is taken at once, and the token it replaced is
  still taken for a while (``IngestTopic``), so pushes the gateway sends with it are not
  refused;
- 503 the queue is full (the gateway retries, or counts the event lost, as for its own
  full persistent queues), or the queue store's disk is (``ENOSPC``, ``EDQUOT``): the
  failed write leaves nothing behind, and the next request after space returns goes in;
  or the queue store's gateway does not answer or fails (an S3 store): what was written
  before the failure is delivered once, as the gateway's retry of the request is
  recognised by the events' identities; or a Topic the replica does not know yet could
  not be looked up (the API server throttling or away, after asking again for a few
  seconds).

Nothing is enqueued for any of them (events of the request delivered directly before the
failure stay delivered; the gateway's retry of the request is recognised by their
identities): a request reserves room in every shard it touches
before it commits to any. Concurrent requests of one Topic are written together
(``groupcommit``): one reservation and one commit per shard the group touches, so under
load one batch file and fsync, or one object, holds the events of several requests, each
answered only once they are durable.

``GET /metrics`` on the same server serves the replica's Prometheus metrics
(docs/metrics.md); ``GET /readyz`` says whether a Service should send it requests and
``GET /healthz`` that its event loop answers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from aiohttp import web

from bucketnotify import compact_json
from bucketnotify.delivery.ingest.groupcommit import GroupCommit
from bucketnotify.delivery.model.event import event_id, shard_of
from bucketnotify.delivery.model.queue import (
    CommitsTogether,
    Entry,
    QueueFull,
    QueueName,
    QueueStore,
    Reservation,
    StoreFull,
    StoreRefused,
    StoreUnavailable,
)
from bucketnotify.delivery.peers.forwarding import FORWARDED_HEADER, Forwarder, forward_expired
from bucketnotify.delivery.recorded.delivery_records import Recorder
from bucketnotify.delivery.rounds.direct import DirectDelivery
from bucketnotify.delivery.topics.ingest_tokens import IngestTopic
from bucketnotify.metrics import DeliveryMetrics

log = logging.getLogger(__name__)

__all__ = ["MAX_BODY_BYTES", "Ingest"]

T = TypeVar("T")

MAX_BODY_BYTES = 4 * 1024 * 1024
STORE_WARNING_S = 5.0
"""At most one warning this often while the queue store is away: an outage under load
would otherwise log a line per request."""


Resolver = Callable[[str, str], Awaitable[IngestTopic | None]]
Rechecker = Callable[[str, str, float], Awaitable[IngestTopic | None]]
"""(namespace, topic, since) → the Topic as a read of its token Secret begun at or after
``since`` (monotonic) found it."""


class Ingest:
    def __init__(
        self,
        store: QueueStore,
        topics: Mapping[tuple[str, str], IngestTopic],
        resolve: Resolver | None = None,
        committed: Callable[[QueueName, int], None] | None = None,
        metrics: DeliveryMetrics | None = None,
        recorder: Recorder | None = None,
        recheck: Rechecker | None = None,
        direct: DirectDelivery | None = None,
        forwarder: Forwarder | None = None,
        tell_owners: Callable[[QueueName, list[int]], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics if metrics is not None else DeliveryMetrics()
        self.topics = topics
        """(namespace, topic) → IngestTopic; kept current by whoever watches the Topics."""
        self._resolve = resolve
        """Asked about a Topic not (yet) in ``topics``: the gateway may push before the
        next refresh has seen a Topic that just became Ready."""
        self._committed = committed
        """Told about every shard that got new entries, so a local owner starts at once
        instead of at its next poll."""
        self._recorder = recorder
        """Writes an ``ingested`` delivery record per committed event."""
        self._recheck = recheck
        """Asked about a known Topic whose token does not match: the token Secret may have
        changed since it was read."""
        self._direct = direct
        """Pushes an event for an empty shard before answering (``delivery.rounds.direct``)."""
        self._forwarder = forwarder
        """Hands a request for a shard another replica owns to that owner
        (``delivery.peers.forwarding``)."""
        self._tell_owners = tell_owners
        """Awaited after a commit, before the answer: tells the owners of the shards
        (other replicas) that they hold entries now."""
        self._groups = GroupCommit(self._write)
        self._store_warned_at = -STORE_WARNING_S
        self._store_refusals = 0
        self._lookup_warned_at = -STORE_WARNING_S
        self._lookup_refusals = 0

    async def commit(self, queue: QueueName, by_shard: dict[int, list[tuple[str, bytes]]]) -> float:
        """All shards or none, durably, together with concurrent commits of the queue.

        Returns the ingest time the entries got (epoch seconds)."""
        if self._direct is None:
            return await self._groups.commit(queue, by_shard)
        async with self._direct.gate.committing((queue, shard) for shard in by_shard):
            return await self._groups.commit(queue, by_shard)

    async def _commit_telling(
        self, queue: QueueName, by_shard: dict[int, list[tuple[str, bytes]]]
    ) -> float:
        """``commit``, then the shards' owners told, before the gateway gets an answer."""
        try:
            return await self.commit(queue, by_shard)
        finally:
            # Also after a failure: a commit to one shard may have landed.
            if self._tell_owners is not None:
                await self._tell_owners(queue, list(by_shard))

    async def _write(self, queue: QueueName, by_shard: dict[int, list[tuple[str, bytes]]]) -> float:
        """One store write: every reservation is taken before anything is committed."""
        now = time.time()
        reserved = await _settled(
            [
                self.store.reserve(queue, shard, len(events), sum(len(b) for _, b in events), now)
                for shard, events in by_shard.items()
            ]
        )
        failure = next((r for r in reserved if isinstance(r, BaseException)), None)
        if failure is not None:
            await asyncio.gather(
                *(self.store.abort(r) for r in reserved if isinstance(r, Reservation))
            )
            raise failure
        reservations = [r for r in reserved if isinstance(r, Reservation)]
        # A commit that fails after another succeeded leaves those events queued; the
        # gateway then sends the whole body again and the duplicates are recognised by
        # their identity when delivered: a duplicate, never a loss. A store that commits
        # together fails them all instead when a write fails (a full disk).
        committed_at = time.time()
        try:
            if len(reservations) > 1 and isinstance(self.store, CommitsTogether):
                outcomes: list[list[Entry] | BaseException] = await self.store.commit_together(
                    [(r, by_shard[r.shard]) for r in reservations], committed_at
                )
            else:
                outcomes = await _settled(
                    [self.store.commit(r, by_shard[r.shard], committed_at) for r in reservations]
                )
            failed = [
                (r, o)
                for r, o in zip(reservations, outcomes, strict=True)
                if isinstance(o, BaseException)
            ]
            if failed:
                # A commit that failed (a full disk) gives its room back now rather than when
                # the sweep finds the reservation abandoned.
                await asyncio.gather(
                    *(self.store.abort(r) for r, _ in failed), return_exceptions=True
                )
                raise failed[0][1]
        finally:
            if self._committed is not None:
                for shard in by_shard:
                    self._committed(queue, shard)
        return committed_at

    async def handle(self, request: web.Request) -> web.Response:
        forwarded = request.headers.get(FORWARDED_HEADER)
        if forwarded is not None:
            # Counted by the replica the gateway reached, not again here.
            if forward_expired(forwarded):
                return web.json_response({"error": "the sender no longer waits"}, status=504)
            return await self._handle(request, forwarded=True)
        try:
            response = await self._handle(request)
        except Exception:
            # aiohttp answers 500 and logs the traceback; the count shows it too.
            self.metrics.ingest_requests.labels("500").inc()
            raise
        self.metrics.ingest_requests.labels(str(response.status)).inc()
        return response

    def _store_unavailable(
        self, queue: QueueName, exc: StoreUnavailable | StoreRefused
    ) -> web.Response:
        self._store_refusals += 1
        now = time.monotonic()
        if now - self._store_warned_at >= STORE_WARNING_S:
            log.warning(
                "queue %s not written, answered 503 (%d such since the last warning): the"
                " queue store is unavailable: %s",
                queue,
                self._store_refusals,
                exc,
            )
            self._store_warned_at, self._store_refusals = now, 0
        return web.json_response({"error": "queue store unavailable"}, status=503)

    def _lookup_failed(self, namespace: str, name: str, exc: Exception) -> web.Response:
        """503 for a Topic the API server would not tell about now (throttling it, away):
        the gateway retries (hand-off persistent); a traceback per request would bury
        the one line worth reading."""
        self._lookup_refusals += 1
        now = time.monotonic()
        if now - self._lookup_warned_at >= STORE_WARNING_S:
            log.warning(
                "topic %s/%s not looked up, answered 503 (%d such since the last warning): %s",
                namespace,
                name,
                self._lookup_refusals,
                str(exc) or type(exc).__name__,
            )
            self._lookup_warned_at, self._lookup_refusals = now, 0
        return web.json_response({"error": "the topic cannot be looked up now"}, status=503)

    async def _handle(self, request: web.Request, *, forwarded: bool = False) -> web.Response:
        arrived = time.monotonic()
        namespace = request.match_info["namespace"]
        name = request.match_info["topic"]
        topic = self.topics.get((namespace, name))
        if topic is None and self._resolve is not None:
            try:
                topic = await self._resolve(namespace, name)
            except Exception as exc:
                return self._lookup_failed(namespace, name, exc)
        if topic is None:
            return web.json_response({"error": "no such persistent topic"}, status=404)
        token = request.match_info["token"]
        if not topic.accepts(token) and self._recheck is not None:
            topic = await self._recheck(namespace, name, arrived) or topic
        if not topic.accepts(token):
            return web.json_response({"error": "wrong token"}, status=403)
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            return web.json_response({"error": "body too large"}, status=413)
        try:
            raw = await request.read()  # bounded by the app's client_max_size
        except web.HTTPRequestEntityTooLarge:
            return web.json_response({"error": "body too large"}, status=413)
        parsed = _records(raw)
        if parsed is None:
            return web.json_response(
                {"error": 'expected JSON {"Records": [...]} with an s3 bucket and key per record'},
                status=400,
            )
        records, bodies = parsed
        ids = [event_id(record) for record in records]
        by_shard: dict[int, list[tuple[str, bytes]]] = {}
        for record, identity, body in zip(records, ids, bodies, strict=True):
            s3 = record["s3"]
            shard = shard_of(s3["bucket"]["name"], s3["object"]["key"], topic.shards)
            by_shard.setdefault(shard, []).append((identity, body))
        if len(by_shard) == 1 and self._forwarder is not None and not forwarded:
            (shard,) = by_shard
            address = self._forwarder.address_of(topic.queue, shard)
            if address is not None and not self._forwarder.failing(address):
                answer = await self._forwarder.send(address, request.raw_path, raw, request.headers)
                if answer is not None:
                    return answer
        if self._direct is not None and len(by_shard) == 1:
            (shard,) = by_shard
            if self._direct.allowed(topic.queue, shard) and await self._direct.gate.take(
                (topic.queue, shard)
            ):
                try:
                    return await self._push_first(topic, shard, records, ids, bodies)
                finally:
                    self._direct.gate.give_back((topic.queue, shard))
        return await self._commit_and_answer(topic, records, ids, by_shard)

    async def _push_first(
        self,
        topic: IngestTopic,
        shard: int,
        records: Sequence[dict[str, Any]],
        ids: list[str],
        bodies: list[bytes],
    ) -> web.Response:
        """Push the request's events (all of one shard, which the caller holds) in order;
        commit the first that fails and all after it."""
        assert self._direct is not None
        at = time.time()
        pushed = 0
        for record, identity, body in zip(records, ids, bodies, strict=True):
            if not await self._direct.push(topic.queue, shard, record, identity, body, at):
                break
            pushed += 1
        if pushed:
            if self._recorder is not None:
                self._recorder.ingested(
                    topic.queue, list(zip(records[:pushed], ids, strict=False)), topic.shards, at
                )
            self.metrics.event_triggered.labels(*_labels(topic)).inc(pushed)
        if pushed == len(records):
            return _committed_answer(len(records))
        rest = {shard: list(zip(ids[pushed:], bodies[pushed:], strict=True))}
        answer: web.Response | None = None
        try:
            answer = await self._commit_and_answer(
                topic, records[pushed:], ids[pushed:], rest, pushed
            )
        finally:
            committed = answer is not None and answer.status == 200
            await self._direct.queued(topic.queue, shard, ids[pushed], committed)
        return answer

    async def _commit_and_answer(
        self,
        topic: IngestTopic,
        records: Sequence[dict[str, Any]],
        ids: list[str],
        by_shard: dict[int, list[tuple[str, bytes]]],
        pushed: int = 0,
    ) -> web.Response:
        """Commit ``records`` (the request's, but for the first ``pushed``, delivered
        already) and answer."""
        started = time.perf_counter()
        try:
            committed_at = await self._commit_telling(topic.queue, by_shard)
        except QueueFull:
            return web.json_response({"error": "queue full"}, status=503)
        except (StoreUnavailable, StoreRefused) as exc:
            return self._store_unavailable(topic.queue, exc)
        except StoreFull:
            log.warning("queue %s not written: the queue store is out of space", topic.queue)
            return web.json_response({"error": "queue store out of space"}, status=503)
        if self._recorder is not None:
            self._recorder.ingested(
                topic.queue, list(zip(records, ids, strict=True)), topic.shards, committed_at
            )
        labels = _labels(topic)
        self.metrics.ingest_commit_seconds.labels(*labels).observe(time.perf_counter() - started)
        self.metrics.event_triggered.labels(*labels).inc(len(records))
        return _committed_answer(pushed + len(records))


def _labels(topic: IngestTopic) -> tuple[str, str]:
    return topic.queue.namespace, topic.queue.topic


def _committed_answer(events: int) -> web.Response:
    return web.Response(body=b'{"committed":%d}' % events, content_type="application/json")


async def _settled(calls: list[Coroutine[Any, Any, T]]) -> list[T | BaseException]:
    """``gather(..., return_exceptions=True)``, but a lone call (one event, one shard: the
    usual request) is awaited as it is, without a task of its own."""
    if len(calls) == 1:
        try:
            return [await calls[0]]
        except Exception as exc:
            return [exc]
    return await asyncio.gather(*calls, return_exceptions=True)


def _records(raw: bytes) -> tuple[Sequence[dict[str, Any]], list[bytes]] | None:
    """The body's event records and each one as it is queued (compact UTF-8 JSON); None
    when the body is not the gateway's JSON."""
    try:
        # UTF-8 without a BOM (RFC 8259), as the gateway sends, and no NaN, Infinity or
        # number beyond a float, which no endpoint could be sent on as JSON.
        body = compact_json.loads(raw, finite=True)
    except (UnicodeError, ValueError, RecursionError):
        return None
    if not isinstance(body, dict) or not isinstance(body.get("Records"), list):
        return None
    records: list[dict[str, Any]] = body["Records"]
    encoded = []
    for record in records:
        try:
            if not (
                isinstance(record, dict)
                and isinstance(record["s3"]["bucket"]["name"], str)
                and isinstance(record["s3"]["object"]["key"], str)
            ):
                return None
            # Lone surrogates (from \ud800 escapes) cannot be hashed, sharded or forwarded
            # as UTF-8, and nesting deeper than the encoder's recursion limit cannot be
            # forwarded at all: both fail here, before anything is queued.
            encoded.append(compact_json.dumps(record))
        except (KeyError, TypeError, UnicodeError, ValueError, RecursionError):
            return None
    return records, encoded
