"""``python -m demo up|down|status``: bucketnotify running on this machine, for a person to see.

``up`` starts (or reuses) the real local services, then the operator, two delivery replicas
sharing a queue store on the gateway, and an HTTP endpoint; applies deploy/samples (an HTTP,
an AMQP and a Kafka Topic, three BucketNotifications on bucket ``uploads``) pointed at this
machine; uploads objects each filter matches and some none does, shows their events arriving
at each endpoint, the queue stats, the metrics, and the Spark report of the delivery records.
Everything keeps running for the person to explore until ``down``; a second ``up`` stops the
running demo first.

The processes run in sessions of their own, so they outlive this command; their pids and
ports are kept in ``$BN_RUN/demo/state.json`` for ``down`` and ``status``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from typing import Any

from bench.programs import free_port
from bench.services import REPO, RUN_DIR, Service, ServiceError, start
from bench.workload import s3_client
from tests.kubectl import Kubectl

from demo import arrivals, report, samples, uploads
from demo.console import DemoError, Ticker, indent, info, step
from demo.processes import BIN, STATE, STATE_DIR, State, alive, log_tail, stop, wait_listening

NAMESPACE = "bucketnotify-demo"
QUEUE_BUCKET = "bucketnotify-demo-queues"
REPLICAS = ("replica-1", "replica-2")
PARTITIONS = 32
ARRIVAL_TIMEOUT_S = 120
# After the last expected event, how long an event a filter should have left out is given
# to show up; the non-matching objects are written first, so they would be early.
GRACE_S = 3
# The metric families worth a first look; docs/metrics.md explains them all.
SHOWN_METRICS = (
    "pubsub_event_triggered_total",
    "pubsub_push_ok_total",
    "pubsub_push_failed_total",
    "pubsub_event_lost_total",
    "bucketnotify_delivery_latency_seconds_count",
    "bucketnotify_lease_partitions_owned",
    "bucketnotify_records_written_total",
)
OPERATOR_METRICS = ("bucketnotify_reconcile_total",)


def up() -> None:
    started = time.monotonic()
    if State.load() is not None:
        step("A demo is already running: stopping it first")
        down(stop_services=False)
    state = State()
    state.data["namespace"] = NAMESPACE
    state.save()

    step("Local services (the first run installs and builds them: minutes; later runs: seconds)")
    services = {name: _service(name) for name in ("kube", "ceph", "rabbitmq", "kafka")}
    kube, rgw = services["kube"], services["ceph"]
    kubectl = Kubectl(kube["KUBECTL"], kube["KUBECONFIG_ADMIN"])
    gateway_env = {
        "BUCKETNOTIFY_GATEWAY_ENDPOINT": rgw["RGW_ENDPOINT"],
        "BUCKETNOTIFY_GATEWAY_ACCESS_KEY": rgw["RGW_ACCESS_KEY"],
        "BUCKETNOTIFY_GATEWAY_SECRET_KEY": rgw["RGW_SECRET_KEY"],
        "BUCKETNOTIFY_GATEWAY_REGION": rgw.env.get("RGW_REGION") or "default",
    }

    step("CRDs, the namespace and the buckets")
    kubectl.apply_path(REPO / "crds")
    kubectl.run("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    if kubectl.run("get", "namespace", NAMESPACE, check=False).returncode != 0:
        kubectl.run("create", "namespace", NAMESPACE)
    info(f"namespace {NAMESPACE}")
    s3 = s3_client(rgw)
    for bucket in (samples.BUCKET, QUEUE_BUCKET):
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
            s3.create_bucket(Bucket=bucket)
    removed = report.clear_records(s3, QUEUE_BUCKET)
    info(f"bucket {samples.BUCKET} (the samples' notifications), bucket {QUEUE_BUCKET} (queues)")
    if removed:
        info(f"removed {removed} delivery record files of an earlier run")

    step("An HTTP endpoint for the events")
    received = STATE_DIR / "received.jsonl"
    received.write_text("")
    port = free_port()
    receiver = state.spawn(
        "receiver",
        [str(BIN / "python"), "-m", "demo.receiver", str(port), str(received)],
        {},
        port=port,
    )
    wait_listening(receiver)
    receiver_url = f"http://127.0.0.1:{receiver['port']}/events"
    info(f"{receiver_url} appends every event to {received}")

    step("Two delivery replicas sharing a queue store on the gateway")
    delivery_env = {
        "KUBECONFIG": kube["KUBECONFIG_ADMIN"],
        "BUCKETNOTIFY_DELIVERY_STORE": f"s3://{QUEUE_BUCKET}",
        "BUCKETNOTIFY_DELIVERY_LEASE_NAMESPACE": NAMESPACE,
        "BUCKETNOTIFY_DELIVERY_NAMESPACES": json.dumps([NAMESPACE]),
        "BUCKETNOTIFY_DELIVERY_PARTITIONS": str(PARTITIONS),
        # Records every second instead of every 5 s: the report step waits for them.
        "BUCKETNOTIFY_DELIVERY_RECORDS_FLUSH_SECONDS": "1",
        "BUCKETNOTIFY_DELIVERY_STATS_INTERVAL_SECONDS": "2",
        "BUCKETNOTIFY_LOG_FORMAT": "plain",
        **gateway_env,
    }
    replicas = []
    for identity in REPLICAS:
        replicas.append(
            state.spawn(
                identity,
                [str(BIN / "bucketnotify"), "delivery"],
                {
                    **delivery_env,
                    "BUCKETNOTIFY_DELIVERY_IDENTITY": identity,
                    "BUCKETNOTIFY_DELIVERY_LISTEN_PORT": str(port := free_port()),
                },
                port=port,
            )
        )
    for proc in replicas:
        wait_listening(proc)
        info(f"{proc['name']}: ingest and /metrics on http://127.0.0.1:{proc['port']}")
    info(f"queues in s3://{QUEUE_BUCKET}, delivery records in s3://{QUEUE_BUCKET}/records")

    step("The operator")
    info(
        "BUCKETNOTIFY_ALLOW_CLEARTEXT_SECRETS=true: the local RabbitMQ and Kafka have no TLS."
        " For this local demo only; never on a cluster"
    )
    operator = state.spawn(
        "operator",
        [str(BIN / "bucketnotify"), "operator"],
        {
            "KUBECONFIG": kube["KUBECONFIG_ADMIN"],
            **gateway_env,
            "BUCKETNOTIFY_NAMESPACES": json.dumps([NAMESPACE]),
            "BUCKETNOTIFY_LEADER_ELECTION_NAMESPACE": NAMESPACE,
            # No Service spreads the ingest here: the gateway pushes to replica-1, which
            # commits to the shared store; replica-2 delivers the shards it owns.
            "BUCKETNOTIFY_INGEST_URL": f"http://127.0.0.1:{replicas[0]['port']}",
            "BUCKETNOTIFY_METRICS_PORT": str(metrics_port := free_port()),
            "BUCKETNOTIFY_ALLOW_CLEARTEXT_SECRETS": "true",
            "BUCKETNOTIFY_LOG_FORMAT": "plain",
        },
        port=metrics_port,
    )
    wait_listening(operator)
    info(f"operator: /metrics on http://127.0.0.1:{metrics_port}")
    _wait_balanced(replicas)

    brokers = samples.Brokers(receiver_url, services["rabbitmq"], services["kafka"])
    objs = samples.for_this_machine(samples.render(kube["KUBECTL"]), brokers, NAMESPACE)
    exchange, routing_key = samples.exchange_of(objs)
    kafka_topic = samples.kafka_topic_of(objs)
    amqp_admin_url = services["rabbitmq"]["AMQP_URL"]

    step("deploy/samples (kubectl kustomize), pointed at this machine")
    info(f"AMQP: exchange {exchange} (declared by the demo), queue bound to key {routing_key}")
    info(f"Kafka: topic {kafka_topic}, read by the demo from its current end")

    def apply_samples() -> None:
        items = {"apiVersion": "v1", "kind": "List", "items": objs}
        kubectl.run("apply", "-f", "-", stdin=json.dumps(items))
        for obj in objs:
            info(samples.describe(obj))
        for obj in objs:
            if obj["kind"] in ("Topic", "BucketNotification"):
                _wait_ready(kubectl, obj["kind"].lower(), obj["metadata"]["name"])
        info("every Topic and BucketNotification is Ready")
        step(f"Uploading to bucket {samples.BUCKET}; events arriving at the three endpoints")
        for op in uploads.OBJECTS:
            target = ", ".join(op.endpoints) or "none"
            verb = "DELETE" if op.delete else "PUT   "
            info(f"{verb} {op.key:<26} -> {target:<11} ({op.why})")

    def upload() -> None:
        for op in uploads.OBJECTS:
            uploads.perform(s3, samples.BUCKET, op)

    expected = uploads.expected_events()
    first_day = dt.datetime.now(dt.UTC).date()
    got = asyncio.run(
        _deliver(
            [
                arrivals.HttpWatcher(received),
                arrivals.AmqpWatcher(amqp_admin_url, exchange, routing_key),
                arrivals.KafkaWatcher(services["kafka"]["KAFKA_BOOTSTRAP"], kafka_topic),
            ],
            expected,
            apply_samples,
            upload,
        )
    )
    problems = arrivals.check(got, expected)
    if problems:
        raise DemoError(
            "the endpoints did not get exactly what the filters let through:\n"
            + "\n".join(f"  {p}" for p in problems)
            + f"\nlogs: {STATE_DIR}/*.log"
        )
    for kind, want in expected.items():
        info(f"{kind}: all {sum(want.values())} expected events arrived, each exactly once")
    left_out = sum(1 for op in uploads.OBJECTS if not op.endpoints)
    info(f"the {left_out} objects no filter matches reached no endpoint")
    queued = [
        o["metadata"]["name"]
        for o in objs
        if o["kind"] == "Topic" and (o["spec"].get("delivery") or {}).get("handoff") != "sync"
    ]
    info(
        f"{', '.join(queued)}: handoff persistent, the gateway's own queue hands events to the"
        " ingest (Ceph 16.2: seconds late) and retries while it is down; handoff sync makes"
        " the S3 request wait for the ingest instead"
    )

    step("Queue stats of the persistent Topics (bucketnotify topic stats)")
    for obj in objs:
        if obj["kind"] == "Topic" and obj["spec"].get("persistent"):
            name = obj["metadata"]["name"]
            info(f"$ bucketnotify topic stats {name} -n {NAMESPACE}")
            stats = subprocess.run(
                [str(BIN / "bucketnotify"), "topic", "stats", name, "-n", NAMESPACE],
                env={**os.environ, **delivery_env},
                capture_output=True,
                text=True,
                check=False,
            )
            print(indent(stats.stdout or stats.stderr), flush=True)

    step("Metrics (excerpt; all of them: docs/metrics.md)")
    for proc in replicas:
        info(f"{proc['name']}: http://127.0.0.1:{proc['port']}/metrics")
        print(indent(_metrics_excerpt(proc["port"], SHOWN_METRICS)), flush=True)
    info(f"operator: http://127.0.0.1:{metrics_port}/metrics")
    print(indent(_metrics_excerpt(metrics_port, OPERATOR_METRICS)), flush=True)

    step("The Spark report of the delivery records (docs/report.md)")
    events = sum(sum(want.values()) for want in expected.values())
    written = report.wait_records_written(
        [p["port"] for p in replicas],
        at_least=2 * events,  # ingested + delivered each
    )
    records_dir, report_dir = STATE_DIR / "records", STATE_DIR / "report"
    shutil.rmtree(records_dir, ignore_errors=True)
    copied = report.copy_records(s3, QUEUE_BUCKET, records_dir)
    info(
        f"{written} records written by the replicas; {copied} files copied from"
        f" s3://{QUEUE_BUCKET}/records to {records_dir}"
    )
    today = dt.datetime.now(dt.UTC).date()
    summary = report.run_report(records_dir, report_dir, first_day, today)
    _show_summary(summary)

    step(f"Running ({time.monotonic() - started:.0f} s). Explore, then stop with `make demo-down`")
    info(f"export KUBECONFIG={kube['KUBECONFIG_ADMIN']}")
    info(f"kubectl get topics,bucketnotifications -n {NAMESPACE}")
    info(f".venv/bin/bucketnotify topic list -n {NAMESPACE}")
    info(f"tail -f {received}")
    info(f"logs: {STATE_DIR}/*.log; `python -m demo status`")


def _service(name: str) -> Service:
    info(f"{name}: starting or reusing deploy/local/{name}.sh")
    return start(name)


async def _deliver(
    watchers: list[arrivals.Watcher],
    expected: uploads.Expected,
    before: Callable[[], None],
    upload: Callable[[], None],
) -> dict[str, Counter[tuple[str, str]]]:
    """The watchers listen from before the samples are applied (the AMQP exchange must
    exist before the first push; the Kafka topic is read from its end as of now)."""
    try:
        for watcher in watchers:
            await watcher.start()
        await asyncio.to_thread(before)
        got = await arrivals.collect(
            watchers,
            expected,
            lambda: asyncio.to_thread(upload),
            wait_s=ARRIVAL_TIMEOUT_S,
            grace_s=GRACE_S,
        )
    finally:
        for watcher in watchers:
            await watcher.close()
    return got


def _wait_balanced(replicas: list[dict[str, Any]], timeout: float = 90) -> None:
    """Until the replicas share the ownership Leases: events are uploaded once both work."""
    ticker = Ticker("the replicas are sharing the Leases")
    deadline = time.monotonic() + timeout
    owned: dict[str, float] = {}
    while time.monotonic() < deadline:
        owned = {
            p["name"]: sum(
                float(line.rsplit(" ", 1)[1])
                for line in _metric_lines(p["port"], ("bucketnotify_lease_partitions_owned",))
            )
            for p in replicas
        }
        if all(owned.values()) and sum(owned.values()) == PARTITIONS:
            shares = ", ".join(f"{name} {n:.0f}" for name, n in owned.items())
            info(f"ownership Leases: {shares} of {PARTITIONS} partitions")
            return
        ticker.tick(str(owned))
        time.sleep(0.5)
    raise DemoError(
        f"the replicas do not share the {PARTITIONS} Leases after {timeout:.0f} s ({owned});"
        f" see their logs in {STATE_DIR}"
    )


def _wait_ready(kubectl: Kubectl, kind: str, name: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    reason = "no status yet"
    while time.monotonic() < deadline:
        obj = kubectl.get(kind, name, NAMESPACE)
        status = obj.get("status") or {}
        ready = {c["type"]: c for c in status.get("conditions", [])}.get("Ready", {})
        # Ready of this generation, not of an earlier run's spec.
        current = status.get("observedGeneration") == obj["metadata"]["generation"]
        if ready.get("status") == "True" and current:
            return
        reason = f"{ready.get('reason')}: {ready.get('message')}" if ready else reason
        time.sleep(0.5)
    raise DemoError(f"{kind} {NAMESPACE}/{name} is not Ready after {timeout:.0f} s ({reason})")


def _metric_lines(port: int, families: tuple[str, ...]) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text: str = response.read().decode()
    return [line for line in text.splitlines() if line.startswith(families)]


def _metrics_excerpt(port: int, families: tuple[str, ...]) -> str:
    lines = [
        line
        for line in _metric_lines(port, families)
        if "namespace=" not in line or f'namespace="{NAMESPACE}"' in line
    ]
    return "\n".join(lines) or "(none yet)"


def _show_summary(summary: dict[str, Any]) -> None:
    outputs = summary["outputs"]
    totals = summary["totals"]
    info(f"report (HTML): {outputs['report']}")
    info(f"summary:       {outputs['summary']}")
    info(f"hourly:        {outputs['parquet']}")
    info(
        f"totals: {totals['triggered']} triggered, {totals['delivered']} delivered,"
        f" {totals['failed_attempts']} failed attempts, {totals['lost']} lost,"
        f" {totals['duplicates_delivered']} duplicates delivered"
    )
    for topic in summary["topics"]:
        info(
            f"  {topic['topic']:<12} delivered {topic['delivered']:>3}"
            f"  latency p50 {_seconds(topic['latency_p50'])}"
            f"  p99 {_seconds(topic['latency_p99'])}"
            f"  queue lag p50 {_seconds(topic['queue_lag_p50'])}"
        )
    info("latency: from the S3 request to the endpoint; queue lag: from our ingest's commit")
    bad = summary["input"]
    if bad["bad_files"] or sum(bad["bad_lines"].values()):
        info(f"bad input: {len(bad['bad_files'])} files; see the summary")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def down(stop_services: bool = True) -> None:
    state = State.load()
    if state is None:
        info("no demo is running")
    else:
        names = {p["name"]: p for p in state.processes}
        operator = names.get("operator")
        if operator and alive(operator["pid"]):
            # While the operator runs, its finalizers remove the gateway's topics and
            # notification Ids; without it the deletion would wait forever.
            step("Deleting the demo's resources (the operator cleans the gateway)")
            kubectl = _kubectl_or_none()
            if kubectl is not None:
                for kind in ("bucketnotifications", "topics"):
                    result = kubectl.run(
                        "delete", kind, "--all", "-n", NAMESPACE, "--timeout=90s", check=False
                    )
                    for line in (result.stdout + result.stderr).strip().splitlines():
                        info(line)
                # Owned by the Topics, but nothing collects garbage on this control plane.
                secrets = [f"{t}-ingest-token" for t in samples.TOPICS]
                secrets += ["amqp-credentials", "kafka-credentials"]
                kubectl.run(
                    "delete",
                    "secret",
                    "--ignore-not-found",
                    "-n",
                    NAMESPACE,
                    *secrets,
                    check=False,
                )
        step("Stopping the demo's processes")
        for proc in reversed(state.processes):
            stop(proc)
        _delete_amqp_queue()
        STATE.unlink()
    if stop_services:
        step("Stopping the local services")
        for name in ("kafka", "rabbitmq", "ceph", "kube"):
            subprocess.run(["bash", str(REPO / "deploy" / "local" / f"{name}.sh"), "stop"])


def _delete_amqp_queue() -> None:
    """The demo's queue, if RabbitMQ runs (its URL, guest's password included, is read from
    the service's env file rather than kept in the demo's state)."""
    env_file = RUN_DIR / "rabbitmq" / "env"
    if not env_file.exists():
        return
    env = dict(line.partition("=")[::2] for line in env_file.read_text().splitlines() if line)
    asyncio.run(arrivals.delete_amqp_queue(env["AMQP_URL"]))


def _kubectl_or_none() -> Kubectl | None:
    try:
        kube = start("kube")
    except ServiceError:
        return None
    return Kubectl(kube["KUBECTL"], kube["KUBECONFIG_ADMIN"])


def status() -> None:
    state = State.load()
    if state is None:
        info("no demo is running (`make demo` starts one)")
        return
    for proc in state.processes:
        running = "running" if alive(proc["pid"]) else "EXITED"
        info(f"{proc['name']:<10} pid {proc['pid']:<8} {running:<8} log {proc['log']}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument(
        "--keep-services", action="store_true", help="down: leave the local services running"
    )
    args = parser.parse_args()
    try:
        if args.command == "up":
            up()
        elif args.command == "down":
            down(stop_services=not args.keep_services)
        else:
            status()
    except (DemoError, ServiceError) as exc:
        print(f"\ndemo failed: {exc}", file=sys.stderr)
        state = State.load()
        for proc in state.processes if state else []:
            if not alive(proc["pid"]):
                print(f"\n{proc['name']} exited; the end of {proc['log']}:", file=sys.stderr)
                print(log_tail(proc), file=sys.stderr)
        if args.command == "up":
            print("stop what was started: `make demo-down`", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
