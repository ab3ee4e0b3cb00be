"""Leader election of the operator's replicas on a real API server: one leads at a time,
a follower takes over at once after a graceful stop, and a leader that cannot renew stops
before anyone else may lead."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from bucketnotify.kube import leadership
from bucketnotify.kube.apiserver import ApiClient, lease_path
from bucketnotify.settings import OperatorSettings
from tests.kubeapi import UNREACHABLE, api_client
from tests.localservices import LocalService


@pytest.fixture()
async def api(kube: LocalService) -> AsyncIterator[ApiClient]:
    async with api_client(kube["KUBECONFIG_ADMIN"]) as client:
        yield client


def quick(namespace: str) -> OperatorSettings:
    return OperatorSettings(
        leader_election_namespace=namespace,
        lease_duration_seconds=4,
        renew_deadline_seconds=3,
        retry_period_seconds=1,
    )


async def holder(api: ApiClient, settings: OperatorSettings) -> str:
    lease = await api.get(
        lease_path(settings.leader_election_namespace, settings.leader_election_lease)
    )
    return str(lease["spec"].get("holderIdentity") or "")


async def stand_in(started: asyncio.Event, stop: asyncio.Event) -> None:
    """kopf's part: runs until its stop flag."""
    started.set()
    await stop.wait()


async def test_a_follower_waits_while_the_leader_renews_and_takes_over_when_it_hands_back(
    kube: LocalService, api: ApiClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = quick(namespace)
    started = {name: asyncio.Event() for name in ("a", "b")}
    stops = {name: asyncio.Event() for name in ("a", "b")}
    # Each replica's bucketnotify_operator_leader gauge, as cli wires it.
    leading = {"a": False, "b": False}

    def told(name: str) -> Callable[[bool], None]:
        return lambda now: leading.__setitem__(name, now)

    async with api_client(kube["KUBECONFIG_ADMIN"]) as other:
        # Every holder b read, in order: the read its winning write was made on says how it
        # took over (a Lease handed back has no holder; one taken on expiry still names a),
        # whatever a busy machine made either take.
        b_read: list[str] = []
        get = other.get
        leader_lease = lease_path(namespace, settings.leader_election_lease)

        async def reading(path: str, **kwargs: Any) -> Any:
            found = await get(path, **kwargs)
            if path == leader_lease:
                b_read.append(str(found["spec"].get("holderIdentity") or ""))
            return found

        monkeypatch.setattr(other, "get", reading)
        a = asyncio.create_task(
            leadership.lead(
                api, settings, "a", stand_in(started["a"], stops["a"]), stops["a"], told("a")
            )
        )
        await asyncio.wait_for(started["a"].wait(), 10)
        b = asyncio.create_task(
            leadership.lead(
                other, settings, "b", stand_in(started["b"], stops["b"]), stops["b"], told("b")
            )
        )
        # Longer than the lease duration: only the leader's renewals keep it.
        await asyncio.sleep(settings.lease_duration_seconds * 2)
        assert not started["b"].is_set()
        assert await holder(api, settings) == "a"
        assert leading == {"a": True, "b": False}

        stops["a"].set()
        await asyncio.wait_for(a, 10)
        await asyncio.wait_for(started["b"].wait(), 30)
        # On the hand-back, not on the lease's expiry: b's write went in at the version it
        # read last before it led, and that version had no holder.
        took_on = b_read[: b_read.index("b")] if "b" in b_read else b_read
        assert took_on[-1] == "", f"b took over a Lease still naming a (expired): {took_on}"
        assert await holder(api, settings) == "b"
        assert leading == {"a": False, "b": True}
        stops["b"].set()
        await asyncio.wait_for(b, 10)
    assert await holder(api, settings) == ""
    assert leading == {"a": False, "b": False}


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """An address that takes connections (the kernel's backlog) and never answers: a hung
    API server or a stalled network path."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


@pytest.mark.parametrize("failure", ["refused", "unanswered"])
async def test_a_leader_that_cannot_renew_stops_before_another_may_lead(
    kube: LocalService,
    api: ApiClient,
    namespace: str,
    failure: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Refused requests fail at once; unanswered ones hang until their timeout, which must
    not carry the leader past its renew deadline. Either way the failed renewals are
    logged before the loss, not only the loss."""
    settings = quick(namespace)
    caplog.set_level(logging.WARNING, logger="bucketnotify")
    with contextlib.ExitStack() as stack:
        away = UNREACHABLE if failure == "refused" else stack.enter_context(silent_server())
        await _leader_loses_the_api_server(kube, api, settings, away)
    said = [r.getMessage() for r in caplog.records if r.name == "bucketnotify"]
    lost = next(i for i, m in enumerate(said) if m.startswith("lost the leader Lease"))
    assert any(m.startswith("the leader Lease: ") for m in said[:lost]), said


async def _leader_loses_the_api_server(
    kube: LocalService, api: ApiClient, settings: OperatorSettings, away: str
) -> None:
    started = {name: asyncio.Event() for name in ("a", "b")}
    stops = {name: asyncio.Event() for name in ("a", "b")}
    b_started_at: list[float] = []

    async with api_client(kube["KUBECONFIG_ADMIN"]) as other:

        async def follower() -> None:
            await started["a"].wait()
            # The leader loses the API server (refused or unanswered from now on).
            api.server = away
            b = asyncio.create_task(
                leadership.lead(
                    other, settings, "b", stand_in(started["b"], stops["b"]), stops["b"]
                )
            )
            await started["b"].wait()
            b_started_at.append(time.monotonic())
            stops["b"].set()
            await b

        follow = asyncio.create_task(follower())
        # Awaited in this task: asyncio lets a SystemExit raised in another task escape
        # the event loop instead of reaching the awaiter.
        with pytest.raises(SystemExit) as ended:
            async with asyncio.timeout(30):
                await leadership.lead(
                    api, settings, "a", stand_in(started["a"], stops["a"]), stops["a"]
                )
        a_stopped_at = time.monotonic()
        assert ended.value.code == 1
        assert stops["a"].is_set()  # kopf was told to stop
        await asyncio.wait_for(follow, 30)
    assert b_started_at[0] > a_stopped_at
