"""The delivery replica's lookup and refresh of Topics, against the real apiserver."""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from typing import Any, cast

import pytest

from bucketnotify.delivery.peers.ownership import Ownership
from bucketnotify.delivery.service import DeliveryService
from bucketnotify.delivery.stores.localdir import LocalDirStore
from bucketnotify.kube.apiserver import ApiError
from bucketnotify.metrics import DeliveryMetrics
from tests.delivery import OwnsEverything
from tests.kubeapi import api_client
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.resources import apply, token_secret


async def test_names_of_topics_that_do_not_exist_are_remembered_within_a_bound(
    kube: LocalService, namespace: str, tmp_path: Path
) -> None:
    """Every push to a Topic the replica does not know asks the API server once (then the
    answer is kept for a second, so a stray sender cannot turn each request into an API
    call), and however many names a sender invents, the replica remembers at most
    MAX_MISSES of them."""
    async with api_client(kube["KUBECONFIG_ADMIN"]) as api:
        service = DeliveryService(
            api=api,
            store=LocalDirStore(tmp_path),
            ownership=cast(Ownership, OwnsEverything()),
            namespaces=[namespace],
            metrics=DeliveryMetrics(),
        )
        service.table.MAX_MISSES = 20
        names = [f"nope-{uuid.uuid4().hex[:8]}" for _ in range(60)]
        for name in names:
            assert await service.resolve(namespace, name) is None
        remembered = service.table._misses
        assert len(remembered) == 20
        # The newest are kept: the oldest were dropped first.
        assert list(remembered) == [(namespace, n) for n in names[-20:]]
        # Remembered: answered without the API server (a closed client would raise).
        await api.close()
        assert await service.resolve(namespace, names[-1]) is None


@pytest.mark.usefixtures("crds")
async def test_a_namespace_that_cannot_be_listed_keeps_its_topics_and_the_others_refresh(
    kube: LocalService, kubectl: Kubectl, namespace: str, tmp_path: Path, caplog: Any
) -> None:
    """Scoped to several namespaces, a replica refreshes each on its own: one whose list is
    refused (its Role deleted, as a namespace deleted whole takes it along) is named in a
    WARNING and keeps the Topics it had, while the others go on being read. A refresh
    fails only when no namespace can be listed."""
    other = f"t-{uuid.uuid4().hex[:10]}"
    kubectl.run("create", "namespace", other)
    for ns in (namespace, other):
        kubectl.run(
            "create", "role", "reader", "-n", ns, "--verb=get,list",
            "--resource=topics.bucketnotify.io,secrets",
        )  # fmt: skip
        kubectl.run(
            "create", "rolebinding", "reader", "-n", ns, "--role=reader",
            "--user=bucketnotify-nobody",
        )  # fmt: skip
        apply(
            kubectl, ns, "Topic", "hook",
            {"endpoint": {"http": {"url": "http://127.0.0.1:9/"}}, "persistent": True},
        )  # fmt: skip
        token_secret(kubectl, ns, "hook")
    async with api_client(kube["KUBECONFIG_NOBODY"]) as api:
        service = DeliveryService(
            api=api,
            store=LocalDirStore(tmp_path),
            ownership=cast(Ownership, OwnsEverything()),
            namespaces=[namespace, other],
            metrics=DeliveryMetrics(),
        )
        try:
            await service.refresh()
            assert set(service.ingest_topics) == {(namespace, "hook"), (other, "hook")}

            kubectl.run("delete", "rolebinding", "reader", "-n", other)
            apply(
                kubectl, namespace, "Topic", "later",
                {"endpoint": {"http": {"url": "http://127.0.0.1:9/"}}, "persistent": True},
            )  # fmt: skip
            token_secret(kubectl, namespace, "later")
            with caplog.at_level(logging.WARNING, logger="bucketnotify.delivery.topics.table"):
                for _ in range(50):  # RBAC takes a moment to see the deletion
                    await service.refresh()
                    if (namespace, "later") in service.ingest_topics and caplog.records:
                        break
                    await asyncio.sleep(0.2)
            assert set(service.ingest_topics) == {
                (namespace, "hook"),
                (namespace, "later"),
                (other, "hook"),
            }
            [warning] = [r.getMessage() for r in caplog.records]
            assert f"cannot list the Topics of namespace {other}" in warning

            kubectl.run("delete", "rolebinding", "reader", "-n", namespace)
            with pytest.raises(ApiError) as refused:
                for _ in range(50):
                    await service.refresh()
                    await asyncio.sleep(0.2)
            assert refused.value.status == 403
        finally:
            for runtime in service.topics.values():
                if runtime.endpoint is not None:
                    await runtime.endpoint.aclose()
            await service.events.aclose()
