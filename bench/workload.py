"""The S3 side of the delivery benchmark: concurrent PUT clients and what reached the endpoint.

Latency is measured from the moment a PUT starts (this process's wall clock) to the moment
the request carrying the record arrived at the receiver (the receiver's wall clock, same
machine). Each key is PUT once with a body of its own, so (key, eTag) names one event and
any further record of it is a duplicate delivery.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from devstack.gateway import SINGLE_ATTEMPT, gateway_client
from devstack.servers.arrivals import Arrival, Receiver
from devstack.services import Service

__all__ = [
    "Collector",
    "PutLog",
    "PutWorkload",
    "delete_everything",
    "object_body",
    "percentiles",
    "s3_client",
]

WARMUP_PREFIX = "warmup-"


def s3_client(rgw: Service, service: str = "s3") -> Any:
    """A client of its own for each PUT thread, which never retries (``SINGLE_ATTEMPT``)."""
    return gateway_client(rgw, service, **SINGLE_ATTEMPT)


def object_body(key: str, size: int) -> bytes:
    """``size`` bytes that start with the key: every object gets an eTag of its own."""
    return f"{key}:".encode().ljust(size, b".")[: max(size, 0)]


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """Nearest-rank p50/p90/p99, max and mean, in milliseconds of the seconds given."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None, "mean": None}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)] * 1000

    return {
        "p50": rank(0.50),
        "p90": rank(0.90),
        "p99": rank(0.99),
        "max": ordered[-1] * 1000,
        "mean": sum(ordered) / len(ordered) * 1000,
    }


@dataclass
class PutLog:
    started: dict[str, float] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


class PutWorkload:
    """``len(clients)`` threads PUT ``keys`` (dealt round-robin) as fast as the gateway answers."""

    def __init__(self, clients: list[Any], bucket: str, keys: list[str], size: int) -> None:
        self.log = PutLog()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(
                target=self._put,
                args=(client, bucket, keys[i :: len(clients)], size),
                name=f"put-{i}",
                daemon=True,
            )
            for i, client in enumerate(clients)
        ]

    def _put(self, client: Any, bucket: str, keys: list[str], size: int) -> None:
        for key in keys:
            if self._stop.is_set():
                return
            body = object_body(key, size)
            start = time.time()
            self.log.started[key] = start
            try:
                client.put_object(Bucket=bucket, Key=key, Body=body)
            except (BotoCoreError, ClientError) as exc:
                self.log.failed[key] = str(exc)
            else:
                self.log.finished[key] = time.time()

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=70)


class Collector:
    """What reached the receiver, for the keys of one run."""

    def __init__(self, receiver: Receiver) -> None:
        self._receiver = receiver
        self.first: dict[str, float] = {}
        """key -> arrival time of its first record."""
        self.deliveries: Counter[tuple[str, str]] = Counter()
        """(key, eTag) -> records received."""
        self.warmup = 0
        self.other = 0
        """Records of no key of this run and no warm-up: should stay 0."""
        self.last_new = time.monotonic()

    def poll(self, expected: Callable[[str], bool]) -> int:
        """Fetch what arrived; returns how many keys arrived for the first time."""
        return self.add(self._receiver.fetch(), expected)

    def add(self, arrivals: Iterable[Arrival], expected: Callable[[str], bool]) -> int:
        new = 0
        for arrival in arrivals:
            if arrival.key.startswith(WARMUP_PREFIX):
                self.warmup += 1
                continue
            if not expected(arrival.key):
                self.other += 1
                continue
            self.deliveries[(arrival.key, arrival.etag)] += 1
            if arrival.key not in self.first:
                self.first[arrival.key] = arrival.at
                new += 1
        if new:
            self.last_new = time.monotonic()
        return new


def delete_everything(clients: list[Any], bucket: str) -> None:
    """Empty and delete ``bucket`` with single DeleteObject calls from all clients at once.

    Never DeleteObjects: a multi-object delete on a bucket with a notification configuration
    aborts the Ceph 16.2 gateway (docs/gateway-compatibility.md).
    """
    paginator = clients[0].get_paginator("list_objects_v2")
    try:
        keys = [
            obj["Key"]
            for page in paginator.paginate(Bucket=bucket)
            for obj in page.get("Contents", [])
        ]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "NoSuchBucket":
            return  # never created: set-up failed before it
        raise
    errors: list[str] = []

    def delete(client: Any, mine: list[str]) -> None:
        for key in mine:
            try:
                client.delete_object(Bucket=bucket, Key=key)
            except (BotoCoreError, ClientError) as exc:
                errors.append(str(exc))

    threads = [
        threading.Thread(target=delete, args=(c, keys[i :: len(clients)]), daemon=True)
        for i, c in enumerate(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"{len(errors)} deletes in {bucket} failed, first: {errors[0]}")
    clients[0].delete_bucket(Bucket=bucket)
