"""The queue stores raise the contract's exceptions, never their drivers' (stores._errors)."""

from __future__ import annotations

import errno

import pytest

from bucketnotify.delivery.model.queue import StoreFull, StoreRefused, StoreUnavailable
from bucketnotify.delivery.stores._errors import mapped, raises_store_errors
from bucketnotify.gateway.errors import (
    GatewayAccessDenied,
    GatewayNotFound,
    GatewayServerError,
    GatewayUnreachable,
)


@pytest.mark.parametrize(
    ("driver", "own"),
    [
        (GatewayUnreachable("ListObjectsV2: the gateway did not answer"), StoreUnavailable),
        (GatewayServerError("PutObject: 503 SlowDown"), StoreUnavailable),
        (GatewayAccessDenied("GetObject: 403 AccessDenied"), StoreRefused),
        (GatewayNotFound("ListObjectsV2: 404 NoSuchBucket"), StoreRefused),
        (OSError(errno.ENOSPC, "No space left on device"), StoreFull),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), StoreFull),
    ],
)
def test_a_drivers_failure_becomes_the_stores_own_with_its_words_and_cause(
    driver: Exception, own: type[Exception]
) -> None:
    got = mapped(driver)
    assert type(got) is own
    assert str(got) == str(driver)
    assert got.__cause__ is driver


def test_other_failures_stay_as_they_are() -> None:
    for exc in (OSError(errno.EIO, "I/O error"), ValueError("bad"), KeyError("k")):
        assert mapped(exc) is exc


@raises_store_errors
class _Store:
    async def queues(self) -> list[str]:
        raise GatewayUnreachable("ListObjectsV2: the gateway did not answer")

    async def remove(self, queue: str, shard: int, ids: list[str]) -> None:
        raise OSError(errno.EIO, "I/O error")

    async def commit_together(self, commits: list[str], now: float) -> list[object]:
        return [["entry"], OSError(errno.ENOSPC, "No space left on device")]

    async def _private(self) -> None:
        raise GatewayUnreachable("not mapped: only the contract's methods are")


async def test_the_contracts_methods_raise_and_return_the_stores_own_exceptions() -> None:
    store = _Store()
    with pytest.raises(StoreUnavailable) as away:
        await store.queues()
    assert isinstance(away.value.__cause__, GatewayUnreachable)
    with pytest.raises(OSError):
        await store.remove("q", 0, [])
    written, failed = await store.commit_together([], 0.0)
    assert written == ["entry"] and isinstance(failed, StoreFull)
    with pytest.raises(GatewayUnreachable):
        await store._private()
