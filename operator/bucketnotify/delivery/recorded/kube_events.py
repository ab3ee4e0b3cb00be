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

A failing endpoint must not become thousands of Events: each (Topic, reason) series is one
Event whose count rises (``bucketnotify.kube.event_recorder``).

Messages never contain secrets: endpoint errors are built without credentials
(``endpoints.errors``), and every message also passes ``logs.redact``.

RBAC: ``create`` and ``patch`` on ``events`` (core group) in the Topics' namespaces, and
``get`` on ``topics`` (for the Event's ``involvedObject.uid``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from bucketnotify.delivery.model.outcomes import RoundResult
from bucketnotify.delivery.model.queue import QueueName
from bucketnotify.kube.event_recorder import EventRecorder, ObjectRef

__all__ = ["COMPONENT", "TopicEvents"]

COMPONENT = "bucketnotify-delivery"


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
        topic = ObjectRef("Topic", *key)
        say = self.recorder.record
        if result.failed and not result.delivered:
            first = health.failing_since is None
            if first:
                health.failing_since, health.failed_pushes = time.time(), 0
            health.failed_pushes += result.failed
            error = result.errors[0] if result.errors else "no acknowledgement"
            say(
                topic,
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
                topic,
                "Normal",
                "EndpointRecovered",
                f"the endpoint takes events again, after {health.failed_pushes} failed pushes"
                f" in {took:.0f} s",
            )
            health.failing_since = None
        if not result.drops_stand:
            return  # nothing was dropped: the next owner or round decides
        if result.expired:
            say(
                topic,
                "Warning",
                "EventsLost",
                "events dropped undelivered (past timeToLive or maxRetries, or refused for"
                " good by the endpoint); set spec.delivery.deadLetterTopic to keep them",
                amount=result.expired,
                unit="events",
            )
        if result.dead_lettered:
            say(
                topic,
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
                ObjectRef("Topic", namespace, topic),
                "Warning",
                reason,
                f"cannot deliver: {problem}; events are accepted and wait in the queue"
                " until this is fixed",
            )
        else:
            self.recorder.record(
                ObjectRef("Topic", namespace, topic),
                "Normal",
                "EndpointReady",
                "the endpoint is configured again; queued events are delivered",
            )
        health.problem = problem

    def queue_full(self, namespace: str, topic: str) -> None:
        self.recorder.record(
            ObjectRef("Topic", namespace, topic),
            "Warning",
            "QueueFull",
            "the queue is full (spec.delivery.maxQueueEntries or maxQueueBytes): the ingest"
            " answers 503 and the gateway retries (handoff persistent) or loses the event"
            " (handoff sync); is the endpoint down? or raise the limits",
            unit="refused ingest requests",
        )

    def forget(self, namespace: str, topic: str) -> None:
        self._health.pop((namespace, topic), None)
        self.recorder.forget("Topic", namespace, topic)

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
