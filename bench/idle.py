"""Idle cost: many persistent Topics, no traffic; what the delivery replicas spend waiting.

``python -m bench.idle [--topics 100] [--shards 8] [--replicas 2] [--idle 60]`` (``make
bench``). Sets up ``--topics`` persistent Topics (hand-off ``sync``, ``--shards`` queue
shards each, the S3 store on the gateway) delivered by ``--replicas`` replicas behind a
round-robin proxy, and one bucket with a BucketNotification per Topic (key prefix
``t<i>/``). Then, with no traffic at all for ``--idle`` seconds, it measures each replica's
CPU and the requests the gateway served (its ``rgw.req`` perf counter; the operator runs
with a drift interval of an hour, so the requests are the replicas'). Last, one object per
Topic is PUT, one at a time, each on a quiet system, and the time from the PUT's start to
the event's arrival at the endpoint is measured: being cheap while idle must not make the
first event slow.

Goals (issue 16): <= 2 % of a core per replica and <= 5 requests/s in total, with the first
event of any Topic delivered within 1 s at p99.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from bench.delivery import PARTITIONS, _best_effort, source_revision
from bench.gateway import Gateway
from bench.guarded import guarded
from bench.kube import SetupError, new_namespace, wait_even_ownership
from bench.operator_scale import apply_list, is_ready, kubectl_bulk, list_objects
from bench.workload import delete_everything, object_body, percentiles, s3_client
from devstack import services
from devstack.gateway import gateway_settings
from devstack.kubectl import Kubectl
from devstack.programs import Program, cpu_seconds, free_port, wait_for_port
from devstack.servers.arrivals import Receiver
from devstack.servers.tcpproxy import Balancer
from devstack.services import REPO, Service

API = "bucketnotify.io/v1alpha1"
GOAL_CPU_PERCENT = 2.0
GOAL_REQUESTS_PER_S = 5.0
GOAL_P99_MS = 1000.0


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def wait_all_ready(
    kubectl: Kubectl, namespace: str, kind: str, count: int, timeout: float
) -> float:
    start = time.monotonic()
    while True:
        ready = sum(1 for o in list_objects(kubectl, namespace, kind) if is_ready(o))
        if ready >= count:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise SetupError(f"{ready} of {count} {kind} Ready after {timeout:.0f} s")
        time.sleep(1)


def start_replicas(
    count: int,
    kube: Service,
    gateway_env: dict[str, str],
    namespace: str,
    store_bucket: str,
    log_dir: Path,
    stack: contextlib.ExitStack,
    profile: bool = False,
) -> tuple[list[Program], Balancer]:
    """``count`` delivery replicas (``replica-1`` ...) serving ``namespace`` with their
    queues in the S3 store ``store_bucket``, and the round-robin proxy before them; stopped
    by ``stack``."""
    replicas: list[Program] = []
    ports = []
    for i in range(count):
        identity = f"replica-{i + 1}"
        port = free_port()
        program = Program(
            ["delivery"],
            {
                "KUBECONFIG": kube["KUBECONFIG_ADMIN"],
                "BUCKETNOTIFY_DELIVERY_STORE": f"s3://{store_bucket}",
                "BUCKETNOTIFY_DELIVERY_LISTEN_PORT": str(port),
                "BUCKETNOTIFY_DELIVERY_LEASE_NAMESPACE": namespace,
                "BUCKETNOTIFY_DELIVERY_NAMESPACES": json.dumps([namespace]),
                "BUCKETNOTIFY_DELIVERY_IDENTITY": identity,
                "BUCKETNOTIFY_DELIVERY_PARTITIONS": str(PARTITIONS),
                **gateway_env,
            },
            name=identity,
            log_dir=log_dir,
            profile=profile,
        )
        stack.callback(program.stop)
        replicas.append(program)
        ports.append(port)
    for program, port in zip(replicas, ports, strict=True):
        wait_for_port(port, 60, program)
    return replicas, stack.enter_context(Balancer(ports))


@dataclass
class Deployment:
    """``topics`` persistent Topics delivered by the replicas, each notified of PUTs under
    ``<topic>/`` of one bucket, every one Ready and the partitions spread evenly."""

    kubectl: Kubectl
    namespace: str
    names: list[str]
    bucket: str
    receiver: Receiver
    replicas: list[Program]
    s3: Any
    setup: dict[str, float]


def deploy(
    args: argparse.Namespace,
    rgw: Service,
    kube: Service,
    stack: contextlib.ExitStack,
    log_dir: Path,
    prefix: str,
    notified: int | None = None,
) -> Deployment:
    """The system of ``args`` (``topics``, ``shards``, ``replicas``, ``profile``) on the S3
    store, torn down by ``stack``; only the first ``notified`` Topics (default: all) get a
    BucketNotification (each one rewrites the bucket's whole configuration)."""
    kubectl = Kubectl.admin(kube)
    kubectl.install_crds()
    s3 = s3_client(rgw)
    namespace = new_namespace(kubectl, f"bench-{prefix}")
    tag = namespace.rsplit("-", 1)[-1]
    store_bucket = f"bnb-{tag}-{prefix}-queues"
    bucket = f"bnb-{tag}-{prefix}"
    gateway_env = gateway_settings(rgw)
    print(f"  namespace {namespace}", flush=True)
    receiver = stack.enter_context(Receiver())
    stack.callback(
        _best_effort,
        f"deleting queue bucket {store_bucket}",
        lambda: delete_everything([s3], store_bucket),
    )
    replicas, proxy = start_replicas(
        args.replicas, kube, gateway_env, namespace, store_bucket, log_dir, stack, args.profile
    )
    identities = [r.name for r in replicas]
    operator = Program(
        ["operator"],
        {
            "KUBECONFIG": kube["KUBECONFIG_ADMIN"],
            **gateway_env,
            "BUCKETNOTIFY_NAMESPACES": json.dumps([namespace]),
            "BUCKETNOTIFY_LEADER_ELECTION_NAMESPACE": namespace,
            "BUCKETNOTIFY_DELIVERY_NAMESPACE": namespace,
            "BUCKETNOTIFY_INGEST_URL": proxy.url,
            "BUCKETNOTIFY_METRICS_PORT": str(free_port()),
            # Its drift checks would be gateway requests of the operator, not the replicas'.
            "BUCKETNOTIFY_DRIFT_INTERVAL_SECONDS": "3600",
        },
        name="operator",
        log_dir=log_dir,
    )
    stack.callback(operator.stop)
    s3.create_bucket(Bucket=bucket)
    stack.callback(
        _best_effort, f"deleting bucket {bucket}", lambda: delete_everything([s3], bucket)
    )
    # Deleted while the operator still runs (its finalizers clean the gateway).
    stack.callback(_delete_all, kubectl, namespace)

    names = [f"t{i:04d}" for i in range(args.topics)]
    topics = [
        {
            "apiVersion": API,
            "kind": "Topic",
            "metadata": {"name": name},
            "spec": {
                "endpoint": {"http": {"url": receiver.url}},
                "persistent": True,
                "delivery": {"handoff": "sync", "shards": args.shards},
            },
        }
        for name in names
    ]
    notifications = [
        {
            "apiVersion": API,
            "kind": "BucketNotification",
            "metadata": {"name": name},
            "spec": {
                "bucket": bucket,
                "topicRef": {"name": name},
                "events": ["s3:ObjectCreated:Put"],
                "filter": {"key": {"prefix": f"{name}/"}},
                "testEvent": False,
            },
        }
        for name in names[:notified]
    ]
    apply_list(kubectl, namespace, topics)
    setup = {"topics_ready_s": wait_all_ready(kubectl, namespace, "Topic", args.topics, 1200)}
    apply_list(kubectl, namespace, notifications)
    setup["notifications_ready_s"] = wait_all_ready(
        kubectl, namespace, "BucketNotification", len(notifications), 1200
    )
    wait_even_ownership(kubectl, namespace, identities, PARTITIONS, 120)
    return Deployment(kubectl, namespace, names, bucket, receiver, replicas, s3, setup)


def run(args: argparse.Namespace, rgw: Service, kube: Service, out: Path) -> dict[str, Any]:
    gateway = Gateway(rgw)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_dir = out / f"idle-{stamp}-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        system = deploy(args, rgw, kube, stack, log_dir, "idle")
        names, bucket, receiver, replicas, s3, setup = (
            system.names,
            system.bucket,
            system.receiver,
            system.replicas,
            system.s3,
            system.setup,
        )
        print(f"  set up: {setup}; quiet for {args.settle:.0f} s first", flush=True)
        time.sleep(args.settle)

        pids: dict[str, int | None] = {p.name: p.pid for p in replicas}
        pids["radosgw"] = services.pid_of("ceph", "rgw.pid")
        pids["ceph-osd"] = services.pid_of("ceph", "osd.pid")
        cpu_before = {n: cpu_seconds(pid) for n, pid in pids.items()}
        requests_before = gateway.requests()
        started = time.monotonic()
        print(f"  idle for {args.idle:.0f} s ...", flush=True)
        time.sleep(args.idle)
        elapsed = time.monotonic() - started
        requests_after = gateway.requests()
        cpu_after = {n: cpu_seconds(pid) for n, pid in pids.items()}
        for program in replicas:
            program.check_alive()
        cpu_percent = {
            n: round(100 * (after - b) / elapsed, 2)
            for n, b in cpu_before.items()
            if b is not None and (after := cpu_after[n]) is not None
        }
        requests_per_s = (
            round((requests_after - requests_before) / elapsed, 2)
            if requests_before is not None and requests_after is not None
            else None
        )

        print(f"  one event per Topic, one at a time ({args.topics}) ...", flush=True)
        latencies: list[float] = []
        missing: list[str] = []
        for name in names:
            key = f"{name}/probe"
            put_at = time.time()
            s3.put_object(Bucket=bucket, Key=key, Body=object_body(key, 100))
            deadline = time.monotonic() + args.probe_timeout
            arrived = None
            while arrived is None and time.monotonic() < deadline:
                arrived = next((a.at for a in receiver.fetch() if a.key == key), None)
                if arrived is None:
                    time.sleep(0.01)
            if arrived is None:
                missing.append(key)
            else:
                latencies.append(arrived - put_at)
            # Quiet again before the next: each probe meets idle shards.
            time.sleep(args.gap)
        for program in replicas:
            program.check_alive()
        return {
            "benchmark": "idle",
            "started": stamp,
            "source": source_revision(),
            "options": vars(args) | {"out": str(args.out)},
            "setup": setup,
            "idle_s": round(elapsed, 1),
            "cpu_percent_of_a_core": cpu_percent,
            "gateway_requests_per_s": requests_per_s,
            "first_event_latency_ms": percentiles(latencies),
            "missing": missing,
            "logs": str(log_dir),
        }


def _delete_all(kubectl: Kubectl, namespace: str) -> None:
    for plural in ("bucketnotifications", "topics"):
        _best_effort(
            f"deleting {plural}",
            lambda p=plural: kubectl_bulk(
                kubectl, "delete", p, "--all", "-n", namespace, "--wait", "--timeout=300s"
            ),
        )


def report(result: dict[str, Any]) -> str:
    cpu = result["cpu_percent_of_a_core"]
    replicas = {n: v for n, v in cpu.items() if n.startswith("replica-")}
    worst = max(replicas.values()) if replicas else None
    lat = result["first_event_latency_ms"]
    rps = result["gateway_requests_per_s"]

    def verdict(value: float | None, goal: float) -> str:
        if value is None:
            return "not measured"
        return "met" if value <= goal else "NOT met"

    o = result["options"]
    lines = [
        f"idle benchmark: {o['topics']} persistent Topics x {o['shards']} shards, "
        f"{o['replicas']} replicas, S3 store, {result['idle_s']} s without traffic",
        f"  CPU % of a core: {cpu}",
        f"  replica CPU, worst: {worst} % (goal <= {GOAL_CPU_PERCENT} %: "
        f"{verdict(worst, GOAL_CPU_PERCENT)})",
        f"  gateway requests/s: {rps} (goal <= {GOAL_REQUESTS_PER_S}: "
        f"{verdict(rps, GOAL_REQUESTS_PER_S)})",
        "  first event per Topic, PUT start to endpoint (ms): "
        + ", ".join(f"{k} {v:.0f}" for k, v in lat.items() if v is not None)
        + f" (p99 goal <= {GOAL_P99_MS:.0f}: {verdict(lat['p99'], GOAL_P99_MS)})",
        f"  missing: {len(result['missing'])}",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.idle",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--idle", type=float, default=60.0, help="seconds without traffic")
    parser.add_argument(
        "--settle", type=float, default=15.0, help="quiet seconds before the idle window"
    )
    parser.add_argument("--gap", type=float, default=0.3, help="seconds between probe events")
    parser.add_argument("--probe-timeout", type=float, default=30.0)
    parser.add_argument("--profile", action="store_true", help="replicas under cProfile")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    if args.topics < 1 or args.shards < 1 or args.replicas < 1 or args.idle <= 0:
        parser.error("--topics, --shards, --replicas and --idle must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)

    def benchmark(started: list[Service]) -> int:
        rgw = services.start("ceph")
        started.append(rgw)
        kube = services.start("kube")
        started.append(kube)
        load_before = os.getloadavg()
        result = run(args, rgw, kube, args.out)
        result["load_average"] = {"before": load_before, "after": os.getloadavg()}
        path = args.out / f"idle-{result['started']}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(report(result))
        print(f"results: {path}")
        return 1 if result["missing"] else 0

    return guarded("bench.idle", benchmark, (SetupError,))


if __name__ == "__main__":
    sys.exit(main())
