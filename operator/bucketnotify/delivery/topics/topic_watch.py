"""The Topics a replica serves, as the API server's watch keeps them: listed once, then
followed, so a refresh of the Topic table reads memory instead of listing every Topic again.

A list of every Topic every few seconds costs a replica the decoding of all of them each
time, and the API server their encoding: at 10,000 Topics, about 20 MB every 3 s per
replica, most of an idle replica's CPU (measured; docs/benchmarks.md). A watch sends only
what changes. Each namespace in scope (or the whole cluster) is followed on its own: listed
from the watch cache, then watched from the list's version; a watch the API server ends is
started again from the last version seen (bookmarks keep it recent), one whose version is
too old (410) is listed again.

Only what the table reads is kept (the metadata that says what changed and the spec): a
Topic's status and managed fields are most of its size.

Until every namespace has been listed once, or when the replica may not watch Topics (a Role
of an older release: one WARNING), the table lists them as it did before (``ready`` is
False). A namespace whose list or watch fails is named in ``failing``: the table keeps its
Topics as they were, as for a list that fails.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp

from bucketnotify.api.common import GROUP, VERSION
from bucketnotify.kube.apiserver import ApiClient, ApiError, object_path

__all__ = ["TopicWatch"]

log = logging.getLogger(__name__)

TopicKey = tuple[str, str]

CACHED = {"resourceVersion": "0"}
RETRY_MIN_S = 1.0
RETRY_MAX_S = 30.0
ALL_NAMESPACES = ""


def slim(topic: dict[str, Any]) -> dict[str, Any]:
    """What the Topic table reads of a Topic: its identity, versions and spec."""
    meta = topic["metadata"]
    return {
        "metadata": {
            k: meta[k]
            for k in ("namespace", "name", "uid", "generation", "resourceVersion")
            if k in meta
        },
        "spec": topic.get("spec") or {},
    }


class TopicWatch:
    """The Topics of ``namespaces`` (all namespaces when empty), kept current by watches
    while ``run`` runs."""

    def __init__(self, api: ApiClient, namespaces: list[str]) -> None:
        self._api = api
        self._scopes = list(namespaces) or [ALL_NAMESPACES]
        self._topics: dict[str, dict[TopicKey, dict[str, Any]]] = {}
        """Per scope (namespace, or ALL_NAMESPACES): the Topics by key."""
        self._failing: set[str] = set()
        self.refused = False
        """The API server refused a watch of Topics (403): ``ready`` stays False."""
        self.changed = asyncio.Event()
        """Set when a Topic was added, changed or deleted (cleared by the reader)."""

    @property
    def ready(self) -> bool:
        return not self.refused and all(s in self._topics for s in self._scopes)

    def snapshot(self) -> tuple[list[dict[str, Any]], set[str]]:
        """Every Topic known, and the namespaces whose list or watch fails now."""
        items = [t for topics in self._topics.values() for t in topics.values()]
        return items, {s for s in self._failing if s != ALL_NAMESPACES}

    async def run(self) -> None:
        """Follow every scope until cancelled (or until a watch is refused)."""
        await asyncio.gather(*(self._follow(scope) for scope in self._scopes))

    async def _follow(self, scope: str) -> None:
        path = object_path(GROUP, VERSION, "topics", scope or None)
        version: str | None = None
        pause = RETRY_MIN_S
        while not self.refused:
            try:
                if version is None:
                    listed = await self._api.get(path, params=CACHED)
                    self._topics[scope] = {_key(t): slim(t) for t in listed["items"]}
                    version = str(listed["metadata"]["resourceVersion"])
                    self.changed.set()
                self._failing.discard(scope)
                async for event in self._api.watch(path, version):
                    if event.get("type") == "ERROR":
                        # 410 Gone: the version fell out of the API server's window.
                        version = None
                        break
                    version = self._apply(scope, event)
                pause = RETRY_MIN_S
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                if exc.status == 403 and version is not None:
                    self.refused = True
                    log.warning(
                        "this replica may not watch Topics (its Role predates it): it lists"
                        " them at every refresh instead"
                    )
                    return
                version = None
                pause = await self._failed(scope, exc, pause)
            except (aiohttp.ClientError, TimeoutError) as exc:
                # A broken stream goes on from the last version seen.
                pause = await self._failed(scope, exc, pause)
            except Exception as exc:
                # Anything else (an answer not understood) is listed again: the watch
                # must not end while the table goes on reading the Topics from here.
                version = None
                pause = await self._failed(scope, exc, pause)

    def _apply(self, scope: str, event: dict[str, Any]) -> str:
        """One watch event into the scope's Topics; the version it brings."""
        topic = event["object"]
        version = str(topic["metadata"]["resourceVersion"])
        kind = event.get("type")
        if kind == "BOOKMARK":
            return version
        topics = self._topics.setdefault(scope, {})
        if kind == "DELETED":
            topics.pop(_key(topic), None)
        else:
            topics[_key(topic)] = slim(topic)
        self.changed.set()
        return version

    async def _failed(self, scope: str, exc: BaseException, pause: float) -> float:
        if scope not in self._failing:
            log.warning(
                "watching the Topics of %s failed, trying again: %s",
                f"namespace {scope}" if scope else "the cluster",
                str(exc) or type(exc).__name__,
            )
        self._failing.add(scope)
        await asyncio.sleep(pause)
        return min(2 * pause, RETRY_MAX_S)


def _key(topic: dict[str, Any]) -> TopicKey:
    meta = topic["metadata"]
    return str(meta["namespace"]), str(meta["name"])
