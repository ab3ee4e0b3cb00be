"""The delivery replica's lookup and refresh of Topics, against the real apiserver."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from bucketnotify.api.topic import ingest_token_secret
from bucketnotify.delivery.model.timings import ServiceTimings
from bucketnotify.delivery.peers.ownership import Ownership
from bucketnotify.delivery.service import DeliveryService
from bucketnotify.delivery.stores.localdir import LocalDirStore
from bucketnotify.delivery.topics.table import SECRETS_LISTED_FROM
from bucketnotify.kube.apiserver import ApiClient, ApiError
from bucketnotify.kube.objects import WATCHED_LABEL
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


class RequestLog:
    """The requests a replica's own client sends (method and path), the API server real."""

    def __init__(self, api: ApiClient) -> None:
        self.sent: list[tuple[str, str]] = []
        send = api.request

        async def request(method: str, path: str, **kwargs: Any) -> Any:
            self.sent.append((method, path))
            return await send(method, path, **kwargs)

        api.request = request  # type: ignore[method-assign]

    def take(self) -> list[tuple[str, str]]:
        sent, self.sent = self.sent, []
        return sent


def secret_reads(sent: list[tuple[str, str]], namespace: str) -> tuple[int, int]:
    """(LISTs of the namespace's Secrets, GETs of one Secret) among ``sent``."""
    listing = f"/api/v1/namespaces/{namespace}/secrets"
    lists = sum(1 for m, p in sent if m == "GET" and p == listing)
    gets = sum(1 for m, p in sent if m == "GET" and p.startswith(listing + "/"))
    return lists, gets


def scoped_service(
    api: ApiClient, namespace: str, tmp_path: Path, **timings: float
) -> DeliveryService:
    """A replica alone with every shard, serving ``namespace``."""
    return DeliveryService(
        api=api,
        store=LocalDirStore(tmp_path),
        ownership=cast(Ownership, OwnsEverything()),
        namespaces=[namespace],
        metrics=DeliveryMetrics(),
        timings=ServiceTimings(**timings),
    )


def persistent_topics(kubectl: Kubectl, namespace: str, names: list[str]) -> dict[str, str]:
    """Persistent Topics with their token Secrets, as the operator would make them; the
    tokens by Topic."""
    endpoint = {"endpoint": {"http": {"url": "http://127.0.0.1:9/"}}, "persistent": True}
    for name in names:
        apply(kubectl, namespace, "Topic", name, endpoint)
    return {name: token_secret(kubectl, namespace, name) for name in names}


@pytest.mark.usefixtures("crds")
async def test_the_secrets_of_many_topics_are_read_again_with_one_list_of_their_namespace(
    kube: LocalService, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """Every Topic's Secrets are read again every ``secret_refresh_s``: with thousands of
    persistent Topics one read each is hundreds of requests a second per replica, so where
    SECRETS_LISTED_FROM Topics of a namespace or more are due, a refresh lists the
    namespace's Secrets labelled as ours once instead (the operator labels those it makes and
    reads), reads one it does not hold on its own, and still takes a rotated token."""
    count = SECRETS_LISTED_FROM + 2
    names = [f"hook-{i}" for i in range(count)]
    tokens = persistent_topics(kubectl, namespace, names)
    # Labelled as the operator labels the Secrets it makes and reads, but for the last:
    # the list holds only ours, and a Secret it does not hold is read on its own.
    for name in names[:-1]:
        kubectl.run(
            "label", "secret", ingest_token_secret(name), "-n", namespace, f"{WATCHED_LABEL}=true"
        )
    async with api_client(kube["KUBECONFIG_ADMIN"]) as api:
        sent = RequestLog(api)
        # Every refresh is a re-read of every Topic's Secrets.
        service = scoped_service(api, namespace, tmp_path, secret_refresh_s=0.001)
        try:

            async def refreshed_until(done: Callable[[], bool]) -> int:
                """Refreshes until ``done``: the list is answered from the API server's
                watch cache, a moment behind the Secrets just written."""
                for refreshes in range(1, 51):
                    await service.refresh()
                    if done():
                        return refreshes
                    await asyncio.sleep(0.1)
                raise AssertionError("not seen after 50 refreshes")

            def accepted(name: str, token: str) -> bool:
                topic = service.ingest_topics.get((namespace, name))
                return topic is not None and topic.accepts(token)

            refreshes = await refreshed_until(lambda: all(accepted(n, tokens[n]) for n in names))
            lists, gets = secret_reads(sent.take(), namespace)
            # Those the watch cache did not hold yet were read on their own the first time.
            assert lists == refreshes and gets >= refreshes
            sent.take()
            await service.refresh()
            assert secret_reads(sent.take(), namespace) == (1, 1)

            rotated = "rotated-" + uuid.uuid4().hex
            kubectl.apply(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {
                        "name": ingest_token_secret(names[0]),
                        "namespace": namespace,
                        "labels": {WATCHED_LABEL: "true"},
                    },
                    "data": {"token": base64.b64encode(rotated.encode()).decode()},
                }
            )
            refreshes = await refreshed_until(lambda: accepted(names[0], rotated))
            # The old one is still taken for the overlap, as after any rotation.
            assert accepted(names[0], tokens[names[0]])
            assert secret_reads(sent.take(), namespace) == (refreshes, refreshes)
        finally:
            await service.table.aclose()
            await service.events.aclose()


@pytest.mark.usefixtures("crds")
async def test_a_replica_that_may_not_list_secrets_reads_each_and_says_so_once(
    kube: LocalService, kubectl: Kubectl, namespace: str, tmp_path: Path, caplog: Any
) -> None:
    """A Role of an older release grants ``get`` of Secrets and no watch of Topics: the list
    of Secrets and the watch are refused once, each said in one WARNING, and the Secrets are
    read one by one, the Topics listed at every refresh, from then on; no Topic goes
    unserved for it."""
    kubectl.run(
        "create", "role", "reader", "-n", namespace, "--verb=get,list",
        "--resource=topics.bucketnotify.io",
    )  # fmt: skip
    kubectl.run("create", "role", "secrets", "-n", namespace, "--verb=get", "--resource=secrets")
    for role in ("reader", "secrets"):
        kubectl.run(
            "create", "rolebinding", role, "-n", namespace, f"--role={role}",
            "--user=bucketnotify-nobody",
        )  # fmt: skip
    count = SECRETS_LISTED_FROM
    names = [f"hook-{i}" for i in range(count)]
    tokens = persistent_topics(kubectl, namespace, names)
    async with api_client(kube["KUBECONFIG_NOBODY"]) as api:
        sent = RequestLog(api)
        service = scoped_service(api, namespace, tmp_path, secret_refresh_s=0.001)
        try:
            with caplog.at_level(logging.WARNING, logger="bucketnotify.delivery.topics"):
                for _ in range(50):  # RBAC takes a moment to see the new bindings
                    try:
                        await service.refresh()
                    except ApiError as exc:
                        assert exc.status == 403
                    if len(service.ingest_topics) == count:
                        break
                    await asyncio.sleep(0.2)
                # Nor may it watch Topics: it lists them at every refresh instead.
                await asyncio.wait_for(service.table.watch.run(), 30)
                assert service.table.watch.refused
                sent.take()
                await service.refresh()
            for name in names:
                assert service.ingest_topics[(namespace, name)].accepts(tokens[name])
            sent_now = sent.take()
            assert secret_reads(sent_now, namespace) == (0, count)
            assert topic_lists(sent_now, namespace) == 1
            for warned in ("may not list Secrets", "may not watch Topics"):
                assert len([r for r in caplog.records if warned in r.getMessage()]) == 1
        finally:
            await service.table.aclose()
            await service.events.aclose()


def topic_lists(sent: list[tuple[str, str]], namespace: str) -> int:
    listing = f"/apis/bucketnotify.io/v1alpha1/namespaces/{namespace}/topics"
    return sum(1 for m, p in sent if m == "GET" and p == listing)


@pytest.mark.usefixtures("crds")
async def test_topics_are_followed_with_a_watch_not_listed_at_every_refresh(
    kube: LocalService, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """Listing every Topic every few seconds costs a replica the decoding of all of them
    (most of an idle replica's CPU at 10,000 Topics): once its watch has listed them, a
    refresh reads the Topics the watch keeps, and a Topic added or deleted reaches the
    table without any further list."""
    persistent_topics(kubectl, namespace, ["first"])
    async with api_client(kube["KUBECONFIG_ADMIN"]) as api:
        sent = RequestLog(api)
        service = scoped_service(api, namespace, tmp_path)
        watching = asyncio.create_task(service.table.watch.run())
        try:
            for _ in range(100):
                if service.table.watch.ready:
                    break
                await asyncio.sleep(0.05)
            assert service.table.watch.ready
            assert topic_lists(sent.take(), namespace) == 1  # the watch's own

            await service.refresh()
            assert set(service.ingest_topics) == {(namespace, "first")}
            persistent_topics(kubectl, namespace, ["second"])
            kubectl.run("delete", "topic", "first", "-n", namespace)
            for _ in range(100):
                await service.refresh()
                if set(service.topics) == {(namespace, "second")}:
                    break
                await asyncio.sleep(0.05)
            assert set(service.topics) == {(namespace, "second")}
            assert (namespace, "second") in service.ingest_topics
            assert topic_lists(sent.take(), namespace) == 0
            assert not watching.done()
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
            await service.table.aclose()
            await service.events.aclose()
