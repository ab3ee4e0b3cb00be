"""Kubernetes Events that count up: one Event object per (object, reason) series.

A failure that repeats must not become thousands of Events. As client-go's event correlator
does, ``EventRecorder`` keeps one Event per series and raises its ``count`` and
``lastTimestamp`` with a PATCH at most every ``update_interval_s`` (the first occurrence
is written at once); a series quiet for ``series_gap_s`` starts a new Event, and the
recorder forgets it then, so its memory follows the series of the last ``series_gap_s``.
Posting runs in the background, so callers never wait for the API server; a failed post is
logged and dropped (Events are best effort, metrics and logs have the numbers). Messages
pass ``logs.redact``.

Used by the operator (Topics and BucketNotifications, the object's uid known) and the
delivery service (Topics, whose uid is read once). RBAC: ``create`` and ``patch`` on
``events`` (core group); ``get`` on the object's kind when its uid is not given.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import Literal, NamedTuple

from bucketnotify import logs
from bucketnotify.api.common import GROUP, VERSION
from bucketnotify.kube.apiserver import ApiClient, ApiError, object_path

__all__ = ["EventRecorder", "EventType", "ObjectRef"]

log = logging.getLogger(__name__)

EventType = Literal["Normal", "Warning"]

PLURALS = {"Topic": "topics", "BucketNotification": "bucketnotifications"}


class ObjectRef(NamedTuple):
    """The object an Event is about (one of ours); ``uid`` None: read it when first needed."""

    kind: str
    namespace: str
    name: str
    uid: str | None = None


SeriesKey = tuple[str, str, str, str]
"""(kind, namespace, name, reason)."""


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
    """Aggregates Events per (object, reason) and writes them in the background."""

    def __init__(
        self,
        api: ApiClient,
        *,
        component: str,
        instance: str,
        update_interval_s: float = 30.0,
        series_gap_s: float = 600.0,
        flush_interval_s: float = 1.0,
    ) -> None:
        self._api = api
        self._component = component
        self._instance = instance
        self._update_interval_s = update_interval_s
        """A series' Event is patched at most this often (its first occurrence at once)."""
        self._series_gap_s = series_gap_s
        """A series with no occurrence for this long ends; the next starts a new Event
        (client-go's correlator uses ten minutes too)."""
        self._flush_interval_s = flush_interval_s
        self._series: dict[SeriesKey, _Series] = {}
        self._uids: dict[tuple[str, str, str], str] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def record(
        self,
        obj: ObjectRef,
        type: EventType,
        reason: str,
        message: str,
        *,
        amount: int = 1,
        unit: str | None = None,
    ) -> None:
        """One occurrence; never blocks, never raises."""
        now = time.time()
        key = (obj.kind, obj.namespace, obj.name, reason)
        if obj.uid is not None:
            if self._uids.get(key[:3], obj.uid) != obj.uid:
                self.forget(*key[:3])  # deleted and made again: its Events are its own
            self._uids[key[:3]] = obj.uid
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

    def forget(self, kind: str, namespace: str, name: str) -> None:
        """The object is gone: nothing more to say about it."""
        for key in [k for k in self._series if k[:3] == (kind, namespace, name)]:
            del self._series[key]
        self._uids.pop((kind, namespace, name), None)

    def _start(self) -> None:
        if self._task is None and not self._closing:
            self._task = asyncio.create_task(self._run(), name="kubernetes events")

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
        ended = time.time() - self._series_gap_s
        for key, series in list(self._series.items()):
            if series.count == series.posted_count:
                if series.last < ended:  # the next occurrence starts a new Event anyway
                    del self._series[key]
                    self._uids.pop(key[:3], None)
                continue
            recent = now - series.written < self._update_interval_s
            if not final and series.name is not None and recent:
                continue
            try:
                await self._write(key, series)
            except Exception as exc:  # best effort: the logs and metrics have it all
                log.warning(
                    "could not post Event %s on %s %s/%s: %s",
                    key[3],
                    key[0],
                    key[1],
                    key[2],
                    exc.reason if isinstance(exc, ApiError) else exc,
                )
                series.posted_count = series.count  # do not retry this occurrence forever
            series.written = time.monotonic()

    async def _write(self, key: SeriesKey, series: _Series) -> None:
        kind, namespace, name, reason = key
        count, last = series.count, _timestamp(series.last)
        if series.name is not None:
            try:
                await self._api.merge_patch(
                    object_path("", "v1", "events", namespace, series.name),
                    {"count": count, "lastTimestamp": last, "message": series.text()},
                )
                series.posted_count = count
                return
            except ApiError as exc:
                if exc.status != 404:  # 404: the API server's Event TTL removed it
                    raise
        uid = await self._uid(kind, namespace, name)
        if uid is None:
            series.posted_count = count  # the object is gone
            return
        created = await self._api.create(
            object_path("", "v1", "events", namespace),
            {
                "metadata": {"generateName": f"{name}.", "namespace": namespace},
                "involvedObject": {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": kind,
                    "name": name,
                    "namespace": namespace,
                    "uid": uid,
                },
                "type": series.type,
                "reason": reason,
                "message": series.text(),
                "count": count,
                "firstTimestamp": _timestamp(series.first),
                "lastTimestamp": last,
                "source": {"component": self._component, "host": self._instance},
                "reportingComponent": self._component,
                "reportingInstance": self._instance,
            },
        )
        series.name = str(created["metadata"]["name"])
        series.posted_count = count

    async def _uid(self, kind: str, namespace: str, name: str) -> str | None:
        uid = self._uids.get((kind, namespace, name))
        if uid is None:
            try:
                obj = await self._api.get(
                    object_path(GROUP, VERSION, PLURALS[kind], namespace, name)
                )
            except ApiError as exc:
                if exc.status == 404:
                    return None
                raise
            uid = str(obj["metadata"]["uid"])
            self._uids[(kind, namespace, name)] = uid
        return uid
