"""What the admin commands read: custom objects, partition Leases and the queue store.

The admin CLI's adapter, and the one place its failures are mapped: an API server or store
error leaves this module as one of ``errors``' kinds, never as a driver's exception. It
writes nothing but the deletion ``topic rm`` asks for.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, TypeVar

import aiohttp
import yaml
from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsError

from bucketnotify.admin.dead_letters import (
    Chosen,
    Selection,
    choose,
    purge,
    redrive,
)
from bucketnotify.admin.errors import AdminError, NotFound, Unreachable
from bucketnotify.api.common import GROUP, VERSION
from bucketnotify.delivery.model.queue import (
    Entry,
    QueueName,
    QueueNotFound,
    QueueStats,
    QueueStore,
    StoreFull,
    StoreRefused,
    StoreUnavailable,
)
from bucketnotify.delivery.peers.ownership import LeaseHolder, LeaseSettings, partition_holders
from bucketnotify.delivery.stores.open import StoreConfigError, store_for
from bucketnotify.kube.apiserver import ApiClient, ApiError, ConfigError, lease_path, object_path
from bucketnotify.kube.objects import connect, current_namespace
from bucketnotify.settings import DeliveryServiceSettings, OperatorSettings

__all__ = [
    "Cluster",
    "Kind",
    "QueueAccess",
    "dead_letters_of",
    "default_namespace",
    "move_back",
    "open_queues",
    "pending",
    "queue_stats",
    "remove_for_good",
]

Kind = Literal["topic", "notification"]
PLURALS: dict[Kind, str] = {"topic": "topics", "notification": "bucketnotifications"}

S = TypeVar("S", bound=BaseSettings)


@contextmanager
def _configuration_errors() -> Iterator[None]:
    try:
        yield
    except (ConfigError, OSError, yaml.YAMLError) as exc:
        raise Unreachable(f"cannot read the Kubernetes configuration: {exc}") from None


def default_namespace() -> str:
    with _configuration_errors():
        return current_namespace()


class Cluster:
    """Custom objects and Leases through one API client; ``async with`` closes it."""

    def __init__(self, api: ApiClient, request_timeout: float) -> None:
        self._api = api
        self._timeout = request_timeout

    @classmethod
    async def connect(cls, request_timeout: float) -> Cluster:
        with _configuration_errors():
            api = await connect()
        return cls(api, request_timeout)

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._api.close()

    @contextmanager
    def _errors(self, not_found: str) -> Iterator[None]:
        try:
            yield
        except ApiError as exc:
            if exc.status == 404:
                raise NotFound(not_found) from None
            if exc.status == 403:
                # The server was reached and said no: the user's to fix (RBAC), not a fault.
                raise AdminError(f"forbidden: {exc.message}") from None
            raise Unreachable(
                f"the API server answered {exc.status} {exc.reason}: {exc.message}"
            ) from None
        except TimeoutError:
            # Its str() is empty: say what timed out, and what sets the wait.
            raise Unreachable(
                f"cannot reach the API server at {self._api.server}: no answer within"
                f" {self._timeout:g} s (--request-timeout)"
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise Unreachable(
                f"cannot reach the API server at {self._api.server}:"
                f" {str(exc) or type(exc).__name__}"
            ) from None

    async def list(self, kind: Kind, namespace: str | None) -> list[dict[str, Any]]:
        """Every object of ``kind`` in ``namespace`` (None: all), by namespace and name."""
        plural = PLURALS[kind]
        missing = f"the API server does not serve {plural}.{GROUP}: apply crds/ first"
        with self._errors(missing):
            listed = await self._api.get(
                object_path(GROUP, VERSION, plural, namespace), request_timeout=self._timeout
            )
        items: list[dict[str, Any]] = listed["items"]
        return sorted(items, key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]))

    async def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any]:
        with self._errors(f"{kind} {namespace}/{name} not found"):
            obj: dict[str, Any] = await self._api.get(
                object_path(GROUP, VERSION, PLURALS[kind], namespace, name),
                request_timeout=self._timeout,
            )
        return obj

    async def delete(self, kind: Kind, namespace: str, name: str) -> bool:
        """Delete the object; True when it is gone, False while finalizers hold it."""
        with self._errors(f"{kind} {namespace}/{name} not found"):
            answer: dict[str, Any] = await self._api.delete(
                object_path(GROUP, VERSION, PLURALS[kind], namespace, name),
                request_timeout=self._timeout,
            )
        # A Status when it went at once; the object, with its deletionTimestamp, otherwise.
        return answer.get("kind") == "Status" or not answer.get("metadata", {}).get("finalizers")

    async def create(
        self, kind: Kind, namespace: str, body: dict[str, Any], *, dry_run: bool = False
    ) -> dict[str, Any]:
        """Create the object (``dry_run``: validated and admitted, not stored); a refusal
        raises ``AdminError`` with the API server's message."""
        with self._errors(f"namespace {namespace} not found"):
            made: dict[str, Any] = await self._api.create(
                object_path(GROUP, VERSION, PLURALS[kind], namespace),
                body,
                params={"dryRun": "All"} if dry_run else None,
                request_timeout=self._timeout,
            )
        return made

    async def lease(self, namespace: str, name: str) -> dict[str, Any]:
        with self._errors(f"Lease {namespace}/{name} not found"):
            lease: dict[str, Any] = await self._api.get(
                lease_path(namespace, name), request_timeout=self._timeout
            )
        return lease

    async def holders(self, leases: LeaseSettings) -> dict[int, LeaseHolder]:
        missing = "the API server does not serve coordination.k8s.io/v1 Leases"
        with self._errors(missing):
            return await partition_holders(self._api, leases, request_timeout=self._timeout)


@dataclass(frozen=True)
class QueueAccess:
    """The queue store and the Leases as the delivery service has them."""

    store: QueueStore
    leases: LeaseSettings

    async def __aenter__(self) -> QueueAccess:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.store.aclose()


def _settings(model: type[S]) -> S:
    try:
        return model()
    except ValidationError as exc:
        # Field and reason only: pydantic's own text would repeat the value, maybe a secret.
        prefix = str(model.model_config.get("env_prefix", ""))
        problems = "; ".join(
            f"{prefix}{'_'.join(map(str, e['loc'])).upper() or '*'}: {e['msg']}"
            for e in exc.errors()
        )
        raise AdminError(f"invalid settings: {problems}") from None
    except SettingsError as exc:
        raise AdminError(f"invalid settings: {exc}") from None


def open_queues() -> QueueAccess:
    """From the delivery service's own settings (BUCKETNOTIFY_DELIVERY_*, _GATEWAY_*)."""
    delivery = _settings(DeliveryServiceSettings)
    try:
        store = store_for(delivery.store, _settings(OperatorSettings))
    except StoreConfigError as exc:
        raise AdminError(str(exc)) from None
    leases = LeaseSettings.of(delivery, owner=None)
    return QueueAccess(store, leases)


@contextmanager
def _store_errors(queue: QueueName) -> Iterator[None]:
    try:
        yield
    except QueueNotFound:
        raise NotFound(
            f"the queue of topic {queue} is not in the queue store "
            "(BUCKETNOTIFY_DELIVERY_STORE): the delivery service creates it when it first "
            "serves the Topic"
        ) from None
    except (StoreUnavailable, StoreRefused, StoreFull, OSError) as exc:
        raise Unreachable(f"cannot read the queue store: {exc}") from None


async def queue_stats(store: QueueStore, queue: QueueName, now: float) -> QueueStats:
    with _store_errors(queue):
        return await store.stats(queue, now)


async def pending(
    store: QueueStore, queue: QueueName, shards: Iterable[int], max_entries: int
) -> list[tuple[int, Entry]]:
    """The oldest entries shard by shard, each shard in commit order, ``max_entries`` in all."""
    found: list[tuple[int, Entry]] = []
    with _store_errors(queue):
        for shard in shards:
            if len(found) >= max_entries:
                break
            entries = await store.list(queue, shard, max_entries - len(found))
            found += [(shard, entry) for entry in entries]
    return found


async def dead_letters_of(store: QueueStore, kept: QueueName, selection: Selection) -> list[Chosen]:
    """The dead letters ``selection`` takes (``NotFound``: the Topic keeps none)."""
    with _store_errors(kept):
        return await choose(store, kept, selection)


async def move_back(
    store: QueueStore,
    *,
    kept: QueueName,
    into: QueueName,
    shards: int,
    letters: list[Chosen],
    rate: float | None,
) -> int:
    with _store_errors(into):
        return await redrive(store, kept=kept, into=into, shards=shards, letters=letters, rate=rate)


async def remove_for_good(store: QueueStore, *, kept: QueueName, letters: list[Chosen]) -> int:
    with _store_errors(kept):
        return await purge(store, kept=kept, letters=letters)
