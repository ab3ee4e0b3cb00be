"""Delivery health at scale: the API server writes it costs, with traffic on some Topics.

``python -m bench.status_writes [--topics 1000] [--busy 100] [--rate 10] [--window 180]``
(``make bench``). Sets up ``--topics`` persistent Topics (hand-off ``sync``, ``--shards``
shards each) delivered by ``--replicas`` replicas, lets the first status writes settle,
then for ``--window`` seconds PUTs ``--rate`` objects a second spread round-robin over the
first ``--busy`` Topics (only they have a BucketNotification). What the API server itself
counted over the window (``apiserver_request_total``) is the figure: Topic status writes
(PATCH topics/status) and the replicas' report writes (PUT configmaps). Every Topic's status
is checked at the end: Delivering True, its backlog 0.

Goal (issue 58): at most one status write per Topic per status interval (30 s), and only
for a Topic whose figures changed: the busy Topics' lastSuccessTime moves at most once a
minute (times are kept to the minute), the idle Topics write nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.delivery import source_revision
from bench.guarded import guarded
from bench.idle import _interrupt, deploy
from bench.kube import SetupError
from bench.operator_scale import kubectl_bulk, list_objects
from bench.workload import object_body
from devstack import services
from devstack.kubectl import Kubectl
from devstack.services import REPO, Service

STATUS_INTERVAL_S = 30.0
"""The operator's default DELIVERY_STATUS_INTERVAL_SECONDS, which the benchmark keeps."""

_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


def apiserver_writes(kubectl: Kubectl) -> dict[str, float]:
    """The API server's own counts: Topic status PATCHes and ConfigMap PUTs, all clients."""
    counts = {"topic_status_patches": 0.0, "configmap_puts": 0.0}
    for line in kubectl_bulk(kubectl, "get", "--raw", "/metrics", timeout=60).splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
        if labels.get("resource") == "topics" and labels.get("subresource") == "status":
            if labels.get("verb") == "PATCH":
                counts["topic_status_patches"] += float(match["value"])
        elif labels.get("resource") == "configmaps" and labels.get("verb") == "PUT":
            counts["configmap_puts"] += float(match["value"])
    return counts


def run(args: argparse.Namespace, rgw: Service, kube: Service, out: Path) -> dict[str, Any]:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_dir = out / f"status-writes-{stamp}-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        # Only the busy Topics need a notification: the others get no events.
        system = deploy(args, rgw, kube, stack, log_dir, "status", notified=args.busy)
        kubectl, namespace = system.kubectl, system.namespace
        print(
            f"  set up: {system.setup}; {args.settle:.0f} s for the first status writes",
            flush=True,
        )
        time.sleep(args.settle)
        busy = system.names[: args.busy]
        stop = threading.Event()
        sent = [0]

        def traffic() -> None:
            period = 1.0 / args.rate
            next_at = time.monotonic()
            while not stop.is_set():
                name = busy[sent[0] % len(busy)]
                key = f"{name}/o{sent[0]}"
                system.s3.put_object(Bucket=system.bucket, Key=key, Body=object_body(key, 100))
                sent[0] += 1
                next_at += period
                time.sleep(max(0.0, next_at - time.monotonic()))

        versions = _versions(kubectl, namespace)
        before = apiserver_writes(kubectl)
        started = time.monotonic()
        putter = threading.Thread(target=traffic, name="traffic", daemon=True)
        putter.start()
        print(f"  {args.rate}/s PUTs over {len(busy)} Topics for {args.window:.0f} s ...")
        time.sleep(args.window)
        stop.set()
        putter.join(timeout=30)
        elapsed = time.monotonic() - started
        after = apiserver_writes(kubectl)
        changed = {n for n, v in _versions(kubectl, namespace).items() if versions.get(n) != v}
        for program in system.replicas:
            program.check_alive()
        # Everything delivered: each status must come back to Delivering True, backlog 0.
        time.sleep(2 * STATUS_INTERVAL_S + 15)
        topics = list_objects(kubectl, namespace, "Topic")
        delivering = [t for t in topics if _delivering(t) == ("True", 0)]
        rates = {
            k: round((after[k] - before[k]) / elapsed, 3)
            for k in ("topic_status_patches", "configmap_puts")
        }
        result = {
            "benchmark": "status_writes",
            "started": stamp,
            "source": source_revision(),
            "options": vars(args) | {"out": str(args.out)},
            "setup": system.setup,
            "window_s": round(elapsed, 1),
            "events_sent": sent[0],
            "apiserver_writes_per_s": rates,
            "apiserver_writes": {k: after[k] - before[k] for k in after},
            "topics_written": {
                "busy": len(changed & set(busy)),
                "idle": len(changed - set(busy)),
            },
            "topics": len(topics),
            "delivering_true_backlog_0": len(delivering),
            "logs": str(log_dir),
        }
        # Printed before the tear-down (deleting a thousand Topics takes minutes).
        print(report(result), flush=True)
        return result


def _versions(kubectl: Kubectl, namespace: str) -> dict[str, str]:
    return {
        t["metadata"]["name"]: t["metadata"]["resourceVersion"]
        for t in list_objects(kubectl, namespace, "Topic")
    }


def _delivering(topic: dict[str, Any]) -> tuple[str | None, int | None]:
    status = topic.get("status") or {}
    condition: dict[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Delivering"), {}
    )
    return condition.get("status"), (status.get("delivery") or {}).get("backlogEvents")


def report(result: dict[str, Any]) -> str:
    o = result["options"]
    rates = result["apiserver_writes_per_s"]
    # One write per busy Topic per status interval at most; the idle ones none.
    bound = o["busy"] / STATUS_INTERVAL_S
    status_rate = rates["topic_status_patches"]
    verdict = "met" if status_rate <= bound else "NOT met"
    return "\n".join(
        [
            f"status writes benchmark: {o['topics']} persistent Topics x {o['shards']} shards,"
            f" {o['replicas']} replicas, {o['rate']} PUT/s over {o['busy']} of them for"
            f" {result['window_s']} s ({result['events_sent']} events)",
            f"  Topic status writes/s (apiserver PATCH topics/status): {status_rate}"
            f" = {status_rate * STATUS_INTERVAL_S / o['topics']:.3f} per Topic per"
            f" {STATUS_INTERVAL_S:.0f} s (goal <= {bound:.2f}/s, one per busy Topic per"
            f" interval: {verdict})",
            f"  Topics written in the window: {result['topics_written']['busy']} of"
            f" {o['busy']} busy, {result['topics_written']['idle']} of"
            f" {o['topics'] - o['busy']} idle",
            f"  health report writes/s (PUT configmaps): {rates['configmap_puts']}",
            f"  Delivering True with backlog 0 at the end: {result['delivering_true_backlog_0']}"
            f" of {result['topics']}",
        ]
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.status_writes",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--busy", type=int, default=100, help="Topics that get traffic")
    parser.add_argument("--rate", type=float, default=10.0, help="PUTs per second")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--window", type=float, default=180.0, help="seconds measured")
    parser.add_argument(
        "--settle", type=float, default=90.0, help="seconds for the first status writes"
    )
    parser.add_argument("--profile", action="store_true", help="replicas under cProfile")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    if not 0 < args.busy <= args.topics or args.rate <= 0 or args.window <= 0:
        parser.error("need 0 < --busy <= --topics, a positive --rate and --window")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)

    def benchmark(started: list[Service]) -> int:
        rgw = services.start("ceph")
        started.append(rgw)
        kube = services.start("kube")
        started.append(kube)
        result = run(args, rgw, kube, args.out)
        path = args.out / f"status-writes-{result['started']}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"results: {path}")
        return 0 if result["delivering_true_backlog_0"] == result["topics"] else 1

    return guarded("bench.status_writes", benchmark, (SetupError,))


if __name__ == "__main__":
    sys.exit(main())
