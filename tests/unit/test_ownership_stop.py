"""A replica stopped while the API server is away (a rolling restart during an API server
outage) still stops: its Leases cannot be handed back, so they expire and the others take
its partitions then, as for a crashed replica; a WARNING says so, no traceback."""

from __future__ import annotations

import logging
import time

import pytest

from bucketnotify.delivery.peers.leases import LeaseSettings
from bucketnotify.delivery.peers.ownership import Ownership
from tests.kubeapi import unreachable_api


async def test_stopping_while_the_api_server_is_away_warns_and_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with unreachable_api() as api:
        ownership = Ownership(api, "replica-a", LeaseSettings(namespace="delivery"))
        # As if its last round had taken two partitions: nothing else would hold any here.
        ownership._held.update({3: time.monotonic(), 7: time.monotonic()})
        with caplog.at_level(logging.WARNING):
            await ownership.stop()
    assert ownership.owned() == set()
    said = [r for r in caplog.records if r.name == "bucketnotify.delivery.peers.ownership"]
    assert len(said) == 3  # two partition Leases and the member Lease
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in said)
    assert "could not release Lease bucketnotify-delivery-partition-3" in said[0].getMessage()
