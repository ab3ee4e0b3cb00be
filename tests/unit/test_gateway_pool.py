"""Writes to one gateway one at a time, a 5xx tried again soon (issue: Ceph 16 answered 500 to
concurrent topic and notification writes of one tenant, and every one of them waited out
kopf's 15 s retry delay), and the name of Ceph's per-notification topic copy."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bucketnotify.gateway.connection import GatewayConnection
from bucketnotify.gateway.errors import GatewayInvalidArgument, GatewayServerError
from bucketnotify.gateway.notifications import copy_topic_arn
from bucketnotify.gateway.pool import Gateway, GatewayPool, WriteRetry
from bucketnotify.gateway.release import release_named

# Nothing listens there: the calls below are ours, the clients are only built.
CONNECTION = GatewayConnection("http://127.0.0.1:9", "AK", "SK")
QUICK = WriteRetry(attempts=4, first_pause_s=0.001, max_pause_s=0.004)


@pytest.fixture()
def gateway() -> Iterator[Gateway]:
    built = Gateway(CONNECTION, asyncio.Lock(), QUICK)
    yield built
    built.close()


def failing(times: int, error: Exception) -> tuple[Callable[[], str], list[int]]:
    calls: list[int] = []

    def call() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise error
        return "done"

    return call, calls


@given(
    st.integers(min_value=1, max_value=50),
    st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_pauses_are_jittered_below_a_doubling_bound_and_a_cap(failures: int, draw: float) -> None:
    retry = WriteRetry(first_pause_s=0.05, max_pause_s=1.0)
    bound = min(1.0, 0.05 * 2 ** (failures - 1))
    assert retry.pause(failures, lambda: draw) == pytest.approx(draw * bound)
    assert 0 <= retry.pause(failures, lambda: draw) < 1.0


async def test_a_500_is_tried_again_until_it_succeeds(gateway: Gateway) -> None:
    call, calls = failing(3, GatewayServerError("PutBucketNotification b/n: 500 UnknownError"))
    assert await gateway.write(call) == "done"
    assert len(calls) == 4


async def test_a_500_that_persists_is_reported_with_the_tries(gateway: Gateway) -> None:
    call, calls = failing(10, GatewayServerError("CreateTopic t: the gateway answered 500"))
    with pytest.raises(GatewayServerError, match=r"answered 500 \(tried 4 times in .* s"):
        await gateway.write(call)
    assert len(calls) == 4


async def test_a_refusal_is_not_tried_again(gateway: Gateway) -> None:
    call, calls = failing(1, GatewayInvalidArgument("PutBucketNotification b/n: 400"))
    with pytest.raises(GatewayInvalidArgument):
        await gateway.write(call)
    assert len(calls) == 1


async def test_writes_to_one_gateway_never_overlap_and_reads_may() -> None:
    pool = GatewayPool(QUICK)
    other_user = GatewayConnection(CONNECTION.endpoint, "AK2", "SK2")
    first, second = await pool.get(CONNECTION), await pool.get(other_user)
    assert first is not second and first is await pool.get(CONNECTION)
    inside, most = 0, 0
    guard = threading.Lock()

    def write() -> None:
        nonlocal inside, most
        with guard:
            inside += 1
            most = max(most, inside)
        threading.Event().wait(0.01)
        with guard:
            inside -= 1

    await asyncio.gather(*(gw.write(write) for gw in (first, second) * 5))
    assert most == 1  # two users of one gateway share its tenant's topics: one lock
    barrier = threading.Barrier(2, timeout=10)
    # Two reads at once, or the barrier times out.
    await asyncio.gather(first.read(barrier.wait), second.read(barrier.wait))
    pool.close()


async def test_the_pool_keeps_only_the_most_recently_used() -> None:
    pool = GatewayPool(QUICK, size=2)
    connections = [GatewayConnection(CONNECTION.endpoint, f"AK{i}", "SK") for i in range(3)]
    built = [await pool.get(c) for c in connections]
    assert await pool.get(connections[2]) is built[2]
    assert await pool.get(connections[0]) is not built[0]
    pool.close()


def test_the_copy_of_a_topic_is_named_notification_underscore_topic() -> None:
    arn = "arn:aws:sns:default:tenant:ns.orders"
    assert copy_topic_arn(arn, "n-1") == "arn:aws:sns:default:tenant:n-1_ns.orders"
    assert copy_topic_arn("arn:aws:sns:default::t", "id") == "arn:aws:sns:default::id_t"
    with pytest.raises(ValueError, match="not a topic ARN"):
        copy_topic_arn("orders", "id")


async def test_a_release_the_setting_names_is_used_without_asking_and_announced_once() -> None:
    """A gateway behind a proxy that hides its release (BUCKETNOTIFY_GATEWAY_RELEASE): the
    gateway (nothing listens at CONNECTION) is never asked, and the metric hook hears of it
    once."""
    heard: list[tuple[str, str, str]] = []
    pool = GatewayPool(
        QUICK,
        release="reef",
        learned=lambda endpoint, release: heard.append(
            (endpoint, release.name, release.learned_from)
        ),
    )
    other_user = GatewayConnection(CONNECTION.endpoint, "AK2", "SK2")
    for connection in (CONNECTION, other_user, CONNECTION):
        assert (await pool.release(connection)).name == "reef"
    assert heard == [(CONNECTION.endpoint, "reef", "setting")]
    pool.close()


async def test_an_unreachable_gateway_is_asked_again_and_not_announced() -> None:
    heard: list[str] = []
    pool = GatewayPool(QUICK, learned=lambda endpoint, release: heard.append(release.name))
    assert (await pool.release(CONNECTION)).learned_from == "unreachable"
    assert (await pool.release(CONNECTION)).learned_from == "unreachable"
    assert heard == []
    pool.close()


def test_a_release_name_the_setting_cannot_take_says_which_it_can() -> None:
    with pytest.raises(ValueError, match="use one of pacific, quincy, reef, squid, tentacle"):
        release_named("octopus")
