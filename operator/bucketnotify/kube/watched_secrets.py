"""The Secrets the operator watches (those labelled ``bucketnotify.io/watched=true``), as
their latest watch event showed them: what a drift check reads instead of a GET each.

Every drift interval the operator checks each Topic, and a Topic's check reads its
Secrets (its ingest token, its credentials, its gateway's): at 5,000 persistent Topics and
a 60 s interval that was 83 GETs a second at the API server for Secrets that had not
changed. The watch already brings each change of these Secrets to the operator (to re-sync
their readers), so the drift checks read the Secret as that watch last showed it
(``Kube.reading_from``). Only the drift checks: a change handler reads from the API server,
so a Secret written a moment ago is seen even before its watch event arrives. The watch
event of a change is taken here before its readers are told, so the check a change sets
off never reads the Secret as it was before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["WatchedSecrets"]


class WatchedSecrets:
    """Namespace -> name -> the Secret (name, resourceVersion, labels and data only)."""

    def __init__(self) -> None:
        self._secrets: dict[str, dict[str, dict[str, Any]]] = {}

    @property
    def by_namespace(self) -> Mapping[str, Mapping[str, dict[str, Any]]]:
        return self._secrets

    def seen(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """Take one watch event of a Secret (``None``: the watch's initial listing)."""
        meta = body.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        if not name:
            return
        if event_type == "DELETED":
            held = self._secrets.get(namespace)
            if held is not None:
                held.pop(name, None)
                if not held:
                    del self._secrets[namespace]
            return
        self._secrets.setdefault(namespace, {})[name] = {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "resourceVersion": meta.get("resourceVersion"),
                "labels": dict(meta.get("labels") or {}),
            },
            "data": dict(body.get("data") or {}),
        }

    def __len__(self) -> int:
        return sum(len(held) for held in self._secrets.values())
