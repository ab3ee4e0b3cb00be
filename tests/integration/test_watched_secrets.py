"""A drift check reads Secrets as the operator's watch of them last showed them, not from
the API server (real apiserver): at thousands of Topics a GET per Topic and drift interval
was most of the operator's load on the API server while nothing changed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bucketnotify.kube.objects import WATCHED_LABEL, Kube, SecretMissing
from bucketnotify.kube.watched_secrets import WatchedSecrets
from tests.kubeapi import api_client
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.resources import credentials_secret


def read_secret(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        kubectl.run("get", "secret", name, "-n", namespace, "-o", "json").stdout
    )
    return found


async def test_secrets_are_read_from_their_watch_events_and_others_from_the_api_server(
    kube: LocalService, kubectl: Kubectl, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Watch events in (initial listing, a rotation, a deletion): reads of those Secrets send
    no request and see the latest event's data; a Secret no event showed is read from the
    API server (and labelled, so its watch events come from then on); a deleted one is read
    from the API server again, which says it is missing."""
    credentials_secret(kubectl, namespace, "watched", "alice", "first-password")
    credentials_secret(kubectl, namespace, "unseen", "bob", "bobs-password")
    kubectl.run("label", "secret", "watched", "-n", namespace, f"{WATCHED_LABEL}=true")
    watched = WatchedSecrets()
    listed = read_secret(kubectl, namespace, "watched")
    watched.seen(None, listed)  # as the watch's initial listing shows it
    assert len(watched) == 1
    kept = watched.by_namespace[namespace]["watched"]
    assert set(kept) == {"metadata", "data"}, "only what a read needs, no managedFields"

    async with api_client(kube["KUBECONFIG_ADMIN"]) as api:
        sent: list[str] = []
        real = api.request

        async def counted(method: str, path: str, **kwargs: Any) -> Any:
            sent.append(f"{method} {path}")
            return await real(method, path, **kwargs)

        monkeypatch.setattr(api, "request", counted)
        reader = Kube(api, label_secrets=True).reading_from(watched.by_namespace)

        assert await reader.secret_key(namespace, "watched", "password") == "first-password"
        assert sent == []

        kubectl.run(
            "patch", "secret", "watched", "-n", namespace, "--type=merge",
            "-p", json.dumps({"stringData": {"password": "rotated-password"}}),
        )  # fmt: skip
        watched.seen("MODIFIED", read_secret(kubectl, namespace, "watched"))
        assert await reader.secret_key(namespace, "watched", "password") == "rotated-password"
        assert sent == []

        assert await reader.secret_key(namespace, "unseen", "username") == "bob"
        assert [s.split()[0] for s in sent if s.endswith("/secrets/unseen")] == ["GET", "PATCH"]
        labels = read_secret(kubectl, namespace, "unseen")["metadata"].get("labels") or {}
        assert labels.get(WATCHED_LABEL) == "true"

        watched.seen("DELETED", listed)
        kubectl.run("delete", "secret", "watched", "-n", namespace)
        sent.clear()
        with pytest.raises(SecretMissing):
            await reader.secret_key(namespace, "watched", "password")
        assert sent == [f"GET /api/v1/namespaces/{namespace}/secrets/watched"]
        assert len(watched) == 0
