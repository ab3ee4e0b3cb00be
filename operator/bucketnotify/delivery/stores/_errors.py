"""The stores' drivers' failures as the ``QueueStore`` contract's own exceptions.

The S3 store's gateway errors become ``StoreUnavailable`` (the gateway unreachable or
failing on its side) or ``StoreRefused`` (anything else it answered), a full disk or quota
of the local store ``StoreFull``:
the ingest, the rounds and the admin CLI then judge a store failure without knowing which
store it was.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from bucketnotify.delivery.model.queue import StoreFull, StoreRefused, StoreUnavailable
from bucketnotify.gateway.errors import GatewayError, GatewayServerError, GatewayUnreachable

__all__ = ["STORE_METHODS", "mapped", "raises_store_errors"]

STORE_METHODS = (
    "create",
    "delete",
    "reserve",
    "commit",
    "commit_together",
    "abort",
    "list",
    "remove",
    "update",
    "stats",
    "glance",
    "glance_many",
    "reclaim",
    "queues",
    "save_delivered",
    "load_delivered",
)
"""The ``QueueStore`` (and ``CommitsTogether``) methods whose failures are mapped."""

_FULL = (errno.ENOSPC, errno.EDQUOT)

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound=type)


def mapped(exc: BaseException) -> BaseException:
    """The store's own exception for a driver's failure (its cause kept), else ``exc``."""
    if isinstance(exc, GatewayError):
        away = isinstance(exc, GatewayUnreachable | GatewayServerError)
        own: BaseException = (StoreUnavailable if away else StoreRefused)(str(exc))
    elif isinstance(exc, OSError) and exc.errno in _FULL:
        own = StoreFull(str(exc))
    else:
        return exc
    own.__cause__ = exc
    return own


def _mapping(
    method: Callable[P, Awaitable[R]], *, outcomes: bool = False
) -> Callable[P, Awaitable[R]]:
    """``method`` raising the store's own exceptions; ``outcomes``: it returns failures as
    values too (``commit_together``), which are mapped the same way."""

    @functools.wraps(method)
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            result = await method(*args, **kwargs)
        except (GatewayError, OSError) as exc:
            own = mapped(exc)
            if own is exc:
                raise
            raise own from exc
        if outcomes and isinstance(result, list):
            each: Any = [mapped(r) if isinstance(r, BaseException) else r for r in result]
            return each  # type: ignore[no-any-return]
        return result

    return call


def raises_store_errors(cls: C) -> C:
    """Class decorator: the store's public methods raise the contract's exceptions."""
    for name in STORE_METHODS:
        method = cls.__dict__.get(name)
        if method is not None:
            setattr(cls, name, _mapping(method, outcomes=name == "commit_together"))
    return cls
