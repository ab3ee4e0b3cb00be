"""Uploads into notified buckets on the test cluster's gateway: a Topic and its
BucketNotification applied with kubectl as a user would, and a steady stream of uploads
that keeps what the gateway acknowledged."""

from __future__ import annotations

import threading
import time
from typing import Any

from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.s3 import s3_client
from tests.waiting import wait_until

API = "bucketnotify.io/v1alpha1"


def condition(kubectl: Kubectl, kind: str, name: str, namespace: str) -> dict[str, Any]:
    status = kubectl.get(kind, name, namespace).get("status") or {}
    return {c["type"]: c for c in status.get("conditions", [])}.get("Ready", {})


def wait_ready(kubectl: Kubectl, kind: str, name: str, namespace: str) -> None:
    wait_until(
        lambda: condition(kubectl, kind, name, namespace),
        lambda c: c.get("status") == "True",
        90,
        f"{kind} {name} Ready",
    )


def notified_bucket(
    ckubectl: Kubectl,
    rgw: LocalService,
    namespace: str,
    bucket: str,
    topic: str,
    spec: dict[str, Any],
    notification: str,
) -> None:
    """Bucket ``bucket``, and a Topic and a BucketNotification of every ObjectCreated event
    on it applied with kubectl, both Ready."""
    s3_client(rgw).create_bucket(Bucket=bucket)
    ckubectl.apply(
        {
            "apiVersion": API,
            "kind": "Topic",
            "metadata": {"name": topic, "namespace": namespace},
            "spec": spec,
        }
    )
    ckubectl.apply(
        {
            "apiVersion": API,
            "kind": "BucketNotification",
            "metadata": {"name": notification, "namespace": namespace},
            "spec": {
                "bucket": bucket,
                "topicRef": {"name": topic},
                "events": ["s3:ObjectCreated:*"],
            },
        }
    )
    wait_ready(ckubectl, "topic", topic, namespace)
    wait_ready(ckubectl, "bucketnotification", notification, namespace)


class Uploads:
    """``writers`` threads PUTting ``prefix/<writer>-00000``, ``prefix/<writer>-00001``, ...
    into ``bucket``, each every 0.1 s, while in its ``with`` block; ``acknowledged`` holds
    the keys the gateway answered 200, ``failed`` those it refused or never answered, and
    ``times`` when each was sent and answered (``time.time()``; answered: None while it
    waits)."""

    def __init__(self, rgw: LocalService, bucket: str, prefix: str, writers: int = 1) -> None:
        # One attempt: a retried PUT would be a second event of its key (botocore's legacy
        # "max_attempts" counts retries, not attempts).
        self._s3 = s3_client(
            rgw,
            retries={"total_max_attempts": 1, "mode": "standard"},
            read_timeout=20,
            connect_timeout=2,
        )
        self._bucket, self._prefix = bucket, prefix
        self.acknowledged: list[str] = []
        self.failed: list[str] = []
        self.times: dict[str, tuple[float, float | None]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._write, args=(w,), daemon=True) for w in range(writers)
        ]
        self._single = writers == 1

    def __enter__(self) -> Uploads:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def unanswered(self, sent_before: float) -> list[str]:
        """The uploads sent before ``sent_before`` that are still waiting for an answer."""
        with self._lock:
            return [
                k
                for k, (sent, answered) in self.times.items()
                if answered is None and sent < sent_before
            ]

    def acknowledged_between(self, began: float, ended: float) -> list[str]:
        with self._lock:
            return [k for k in self.acknowledged if began <= (self.times[k][1] or 0) <= ended]

    def _write(self, writer: int) -> None:
        i = 0
        while not self._stop.is_set():
            key = f"{self._prefix}/{i:05d}" if self._single else f"{self._prefix}/{writer}-{i:05d}"
            with self._lock:
                self.times[key] = (time.time(), None)
            try:
                self._s3.put_object(Bucket=self._bucket, Key=key, Body=b"x")
                ok = True
            except Exception as exc:  # a refused write is not acknowledged: not counted
                print(f"write {key}: {exc}")
                ok = False
            with self._lock:
                self.times[key] = (self.times[key][0], time.time())
                (self.acknowledged if ok else self.failed).append(key)
            i += 1
            time.sleep(0.1)
