"""The delivery replica's lookup of Topics it does not know, against the real apiserver."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import cast

from bucketnotify.delivery.ownership import Ownership
from bucketnotify.delivery.service import DeliveryService
from bucketnotify.delivery.stores.localdir import LocalDirStore
from bucketnotify.metrics import DeliveryMetrics
from tests.delivery import OwnsEverything
from tests.kubeapi import api_client
from tests.localservices import LocalService


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
        service.MAX_MISSES = 20
        names = [f"nope-{uuid.uuid4().hex[:8]}" for _ in range(60)]
        for name in names:
            assert await service.resolve(namespace, name) is None
        remembered = service._misses
        assert len(remembered) == 20
        # The newest are kept: the oldest were dropped first.
        assert list(remembered) == [(namespace, n) for n in names[-20:]]
        # Remembered: answered without the API server (a closed client would raise).
        await api.close()
        assert await service.resolve(namespace, names[-1]) is None
