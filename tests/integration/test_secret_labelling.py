"""The operator labels each Secret it reads so that the Secret's changes reach its watch; the
watch event of that label carries data the reader already used, and must not re-sync the
Topics that use the Secret (real apiserver)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from bucketnotify.kube.apiserver import ApiClient
from bucketnotify.kube.objects import WATCHED_LABEL, Kube
from tests.kubeapi import api_client
from tests.kubectl import Kubectl
from tests.localservices import LocalService


class AnswersHeldBack:
    """The API client's PATCH requests reach the API server at once, and their answers come
    back to the caller only once ``release`` is set: the order in which a watch event can
    overtake the answer of the request that caused it."""

    def __init__(self, api: ApiClient) -> None:
        self._api = api
        self.release = asyncio.Event()

    async def get(self, path: str, **kwargs: Any) -> Any:
        return await self._api.get(path, **kwargs)

    async def merge_patch(self, path: str, body: Any, **kwargs: Any) -> Any:
        answer = await self._api.merge_patch(path, body, **kwargs)
        await self.release.wait()
        return answer


async def labelled_version(api: ApiClient, namespace: str, name: str) -> str:
    """The resourceVersion of the Secret once the label is on it, as a watch would see it."""
    path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
    for _ in range(100):
        secret = await api.get(path)
        if (secret["metadata"].get("labels") or {}).get(WATCHED_LABEL) == "true":
            return str(secret["metadata"]["resourceVersion"])
        await asyncio.sleep(0.05)
    raise AssertionError(f"Secret {namespace}/{name} was never labelled")


async def test_the_label_is_known_as_ours_even_when_its_watch_event_comes_first(
    kube: LocalService, kubectl: Kubectl, namespace: str
) -> None:
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "gw", "namespace": namespace},
            "stringData": {"accessKey": "a"},
        }
    )
    async with api_client(kube["KUBECONFIG_ADMIN"]) as api:
        held = AnswersHeldBack(api)
        operator = Kube(cast(ApiClient, held), label_secrets=True)
        reading = asyncio.create_task(operator.secret_data(namespace, "gw"))
        version = await labelled_version(api, namespace, "gw")

        # The watch event of the label, ahead of the patch's answer: the question waits for
        # the answer rather than calling the label somebody else's change.
        asking = asyncio.create_task(operator.labelled_by_us(namespace, "gw", version))
        await asyncio.sleep(0.3)
        assert not asking.done()
        held.release.set()
        assert await asking
        assert await reading == {"accessKey": "a"}

        # A change made afterwards by the Secret's owner is not the operator's.
        kubectl.run(
            "patch", "secret", "gw", "-n", namespace, "-p", '{"stringData":{"accessKey":"b"}}'
        )
        changed = kubectl.get("secret", "gw", namespace)["metadata"]["resourceVersion"]
        assert changed != version
        assert not await operator.labelled_by_us(namespace, "gw", changed)
        # An already labelled Secret is read without a patch, so nothing is waited for.
        assert await operator.secret_data(namespace, "gw") == {"accessKey": "b"}
