"""Kubernetes Events the delivery service posts on Topics: what changed for their delivery.

``TopicEvents`` turns what the service sees into Events, once per transition:

- ``EndpointFailing`` (Warning): a round's pushes failed and none succeeded, after the
  endpoint had worked (or on the first try); ``EndpointRecovered`` (Normal) when pushes
  succeed again, with how many failed meanwhile;
- ``EventsLost`` (Warning): events dropped undelivered (timeToLive, maxRetries,
  undeliverable) without a dead-letter topic; ``EventsDeadLettered`` (Warning): dropped
  into the dead-letter topic;
- ``QueueFull`` (Warning): the ingest refused a request with 503;
- ``SecretNotFound`` / ``EndpointInvalid`` (Warning): the endpoint cannot be opened as
  specified (events wait in the queue); ``EndpointReady`` (Normal) once it can.

A failing endpoint must not become thousands of Events: ``EventRecorder`` keeps one
Event object per (Topic, reason) series, as client-go's event correlator does, and
raises its ``count`` and ``lastTimestamp`` with a PATCH at most every
``update_interval_s``; a series quiet for ``series_gap_s`` starts a new Event. Posting runs
in the background, so the shard loops never wait for the API server; a failed post is
logged and dropped (Events are best effort, metrics and logs have the numbers).

Messages never contain secrets: endpoint errors are built without credentials
(``endpoints.errors``), and every message also passes ``logs.redact``.

RBAC: ``create`` and ``patch`` on ``events`` (core group) in the Topics' namespaces, and
``get`` on ``topics`` (for the Event's ``involvedObject.uid``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from bucketnotify import logs
from bucketnotify.api.common import GROUP, VERSION
from bucketnotify.delivery.queue import QueueName
from bucketnotify.delivery.worker import RoundResult

__all__ = ["COMPONENT", "EventRecorder", "TopicEvents"]

log = logging.getLogger(__name__)

COMPONENT = "bucketnotify-delivery"
EventType = Literal["Normal", "Warning"]
SeriesKey = tuple[str, str, str]
"""(namespace, Topic name, reason)."""


def _timestamp(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Series:
    type: EventType
    message: str
    unit: str | None
    """What ``total`` counts (``events``); None: the message stands alone."""
    first: float
    last: float
    count: int = 0
    """Occurrences (the Event's ``count``)."""
    total: int = 0
    name: str | None = None
    """The Event object, once created."""
    written: float = -1e9
    """Monotonic time of the last write."""
    posted_count: int = 0

    def text(self) -> str:
        if self.unit is None:
            return self.message
        return f"{self.message} ({self.total} {self.unit} since {_timestamp(self.first)})"


class EventRecorder:
    """Aggregates Events per (Topic, reason) and writes them in the background."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        instance: str,
        update_interval_s: float = 30.0,
        series_gap_s: float = 600.0,
        flush_interval_s: float = 1.0,
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._instance = instance
        self._update_interval_s = update_interval_s
        """A series' Event is patched at most this often (its first occurrence at once)."""
        self._series_gap_s = series_gap_s
        """A series with no occurrence for this long ends; the next starts a new Event
        (client-go's correlator uses ten minutes too)."""
        self._flush_interval_s = flush_interval_s
        self._series: dict[SeriesKey, _Series] = {}
        self._uids: dict[tuple[str, str], str] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def record(
        self,
        namespace: str,
        topic: str,
        type: EventType,
        reason: str,
        message: str,
        *,
        amount: int = 1,
        unit: str | None = None,
    ) -> None:
        """One occurrence; never blocks, never raises."""
        now = time.time()
        key = (namespace, topic, reason)
        series = self._series.get(key)
        if series is None or now - series.last > self._series_gap_s:
            series = _Series(type, "", unit, first=now, last=now)
            self._series[key] = series
        series.message = logs.redact(message)  # the latest says most (an error may change)
        series.count += 1
        series.total += amount
        series.last = now
        self._start()
        if series.name is None:
            self._wake.set()

    def forget(self, namespace: str, topic: str) -> None:
        """The Topic is gone: nothing more to say about it."""
        for key in [k for k in self._series if k[:2] == (namespace, topic)]:
            del self._series[key]
        self._uids.pop((namespace, topic), None)

    def _start(self) -> None:
        if self._task is None and not self._closing:
            self._task = asyncio.create_task(self._run(), name="topic events")

    async def aclose(self) -> None:
        """Write what is pending (bounded by the API client's timeouts), then stop."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._flush(final=True)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._flush_interval_s)
            self._wake.clear()
            await self._flush(final=False)

    async def _flush(self, *, final: bool) -> None:
        now = time.monotonic()
        for key, series in list(self._series.items()):
            if series.count == series.posted_count:
                continue
            recent = now - series.written < self._update_interval_s
            if not final and series.name is not None and recent:
                continue
            try:
                await self._write(key, series)
            except Exception as exc:  # best effort: the logs and metrics have it all
                log.warning(
                    "could not post Event %s on Topic %s/%s: %s",
                    key[2],
                    key[0],
                    key[1],
                    exc.reason if isinstance(exc, ApiException) else exc,
                )
                series.posted_count = series.count  # do not retry this occurrence forever
            series.written = time.monotonic()

    async def _write(self, key: SeriesKey, series: _Series) -> None:
        namespace, topic, reason = key
        count, last = series.count, _timestamp(series.last)
        if series.name is not None:
            try:
                await self._core.patch_namespaced_event(
                    series.name,
                    namespace,
                    {"count": count, "lastTimestamp": last, "message": series.text()},
                    _content_type="application/merge-patch+json",  # type: ignore[call-arg]
                )
                series.posted_count = count
                return
            except ApiException as exc:
                if exc.status != 404:  # 404: the API server's Event TTL removed it
                    raise
        uid = await self._uid(namespace, topic)
        if uid is None:
            series.posted_count = count  # the Topic is gone
            return
        created = await self._core.create_namespaced_event(
            namespace,
            {  # type: ignore[arg-type]
                "metadata": {"generateName": f"{topic}.", "namespace": namespace},
                "involvedObject": {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "Topic",
                    "name": topic,
                    "namespace": namespace,
                    "uid": uid,
                },
                "type": series.type,
                "reason": reason,
                "message": series.text(),
                "count": count,
                "firstTimestamp": _timestamp(series.first),
                "lastTimestamp": last,
                "source": {"component": COMPONENT, "host": self._instance},
                "reportingComponent": COMPONENT,
                "reportingInstance": self._instance,
            },
        )
        series.name = created.metadata.name
        series.posted_count = count

    async def _uid(self, namespace: str, topic: str) -> str | None:
        uid = self._uids.get((namespace, topic))
        if uid is None:
            try:
                obj = await self._custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, "topics", topic
                )
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
            uid = str(obj["metadata"]["uid"])
            self._uids[(namespace, topic)] = uid
        return uid


@dataclass
class _Health:
    failing_since: float | None = None
    failed_pushes: int = 0
    problem: str | None = None


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class TopicEvents:
    """What the delivery service says about its Topics (see the module docstring)."""

    def __init__(self, recorder: EventRecorder) -> None:
        self.recorder = recorder
        self._health: dict[tuple[str, str], _Health] = {}

    def round_done(self, queue: QueueName, result: RoundResult) -> None:
        """After every processing round of a shard."""
        key = (queue.namespace, queue.topic)
        health = self._health.setdefault(key, _Health())
        say = self.recorder.record
        if result.failed and not result.delivered:
            first = health.failing_since is None
            if first:
                health.failing_since, health.failed_pushes = time.time(), 0
            health.failed_pushes += result.failed
            error = result.errors[0] if result.errors else "no acknowledgement"
            say(
                *key,
                "Warning",
                "EndpointFailing",
                f"pushes to the endpoint fail ({error}); the events stay queued and are"
                " retried: check the endpoint, its address and credentials",
                amount=result.failed,
                unit="failed pushes",
            )
        elif result.delivered and not result.failed and health.failing_since is not None:
            took = time.time() - health.failing_since
            say(
                *key,
                "Normal",
                "EndpointRecovered",
                f"the endpoint takes events again, after {health.failed_pushes} failed pushes"
                f" in {took:.0f} s",
            )
            health.failing_since = None
        if result.fenced:
            return  # nothing was dropped: the next owner decides
        if result.expired:
            say(
                *key,
                "Warning",
                "EventsLost",
                "events dropped undelivered (past timeToLive or maxRetries, or refused for"
                " good by the endpoint); set spec.delivery.deadLetterTopic to keep them",
                amount=result.expired,
                unit="events",
            )
        if result.dead_lettered:
            say(
                *key,
                "Warning",
                "EventsDeadLettered",
                "events dropped undelivered (past timeToLive or maxRetries, or refused for"
                " good by the endpoint) went to the dead-letter topic",
                amount=result.dead_lettered,
                unit="events",
            )

    def endpoint_state(self, namespace: str, topic: str, problem: str | None, reason: str) -> None:
        """After the endpoint was (re)opened: ``problem`` says why it cannot be, or None."""
        health = self._health.setdefault((namespace, topic), _Health())
        if problem == health.problem:
            return
        if problem is not None:
            self.recorder.record(
                namespace,
                topic,
                "Warning",
                reason,
                f"cannot deliver: {problem}; events are accepted and wait in the queue"
                " until this is fixed",
            )
        else:
            self.recorder.record(
                namespace,
                topic,
                "Normal",
                "EndpointReady",
                "the endpoint is configured again; queued events are delivered",
            )
        health.problem = problem

    def queue_full(self, namespace: str, topic: str) -> None:
        self.recorder.record(
            namespace,
            topic,
            "Warning",
            "QueueFull",
            "the queue is full (spec.delivery.maxQueueEntries or maxQueueBytes): the ingest"
            " answers 503 and the gateway retries (handoff persistent) or loses the event"
            " (handoff sync); is the endpoint down? or raise the limits",
            unit="refused ingest requests",
        )

    def forget(self, namespace: str, topic: str) -> None:
        self._health.pop((namespace, topic), None)
        self.recorder.forget(namespace, topic)

    @web.middleware
    async def ingest_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Notices the ingest's 503 (queue full) without the ingest knowing of Events."""
        response = await handler(request)
        if response.status == 503:
            info = request.match_info
            if "namespace" in info and "topic" in info:
                self.queue_full(info["namespace"], info["topic"])
        return response

    async def aclose(self) -> None:
        await self.recorder.aclose()
