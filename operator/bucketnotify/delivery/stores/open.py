"""The queue store a URL names (BUCKETNOTIFY_DELIVERY_STORE), for the service and the CLI.

Both must read the same queues, so both build the store here: ``dir:///absolute/path`` is a
``LocalDirStore``, ``s3://bucket`` an ``S3Store`` on the default gateway
(BUCKETNOTIFY_GATEWAY_*).
"""

from __future__ import annotations

from pathlib import Path

from bucketnotify.delivery.model.queue import QueueStore
from bucketnotify.delivery.stores.localdir import LocalDirStore
from bucketnotify.delivery.stores.s3 import S3Store
from bucketnotify.gateway.connection import GatewayConnection
from bucketnotify.settings import DeliveryServiceSettings, OperatorSettings

__all__ = ["StoreConfigError", "gateway_connection", "open_store", "store_for"]


class StoreConfigError(ValueError):
    """The settings name no store we can build; the message says which setting to fix."""


def store_for(url: str, operator: OperatorSettings) -> QueueStore:
    """The store ``url`` names, without touching it (a reader must not create a bucket)."""
    scheme, _, rest = url.partition("://")
    if scheme == "dir" and rest.startswith("/"):
        return LocalDirStore(Path(rest))
    if scheme == "s3" and rest:
        return S3Store(gateway_connection(operator, "an s3:// store"), rest)
    # The value itself stays out of the message: a URL may carry more than its owner meant
    # to show.
    raise StoreConfigError("BUCKETNOTIFY_DELIVERY_STORE: use dir:///absolute/path or s3://bucket")


def gateway_connection(operator: OperatorSettings, what: str) -> GatewayConnection:
    """The default gateway (BUCKETNOTIFY_GATEWAY_*), which ``what`` needs."""
    if not (
        operator.gateway_endpoint and operator.gateway_access_key and operator.gateway_secret_key
    ):
        raise StoreConfigError(
            f"{what} needs BUCKETNOTIFY_GATEWAY_ENDPOINT, _ACCESS_KEY, _SECRET_KEY"
        )
    return GatewayConnection(
        operator.gateway_endpoint,
        operator.gateway_access_key,
        operator.gateway_secret_key.get_secret_value(),
        operator.gateway_region,
    )


async def open_store(settings: DeliveryServiceSettings, operator: OperatorSettings) -> QueueStore:
    """The delivery service's store, ready to write to: an s3 bucket is created if missing.

    A bad setting ends the process with the message alone: a traceback would bury it.
    """
    try:
        store = store_for(settings.store, operator)
    except StoreConfigError as exc:
        raise SystemExit(str(exc)) from None
    if isinstance(store, S3Store):
        await store.ensure_bucket()
    return store
