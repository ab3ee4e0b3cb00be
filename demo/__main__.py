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
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from demo import arrivals, report, samples, show, uploads
from demo.console import DemoError, info, step
from demo.processes import STATE, STATE_DIR, State, alive, log_tail, stop
from demo.stack import NAMESPACE, QUEUE_BUCKET, Stack, start_stack
from devstack.gateway import SINGLE_ATTEMPT, gateway_client
from devstack.kubectl import Kubectl
from devstack.services import LOCAL, RUN_DIR, Service, ServiceError, read_env, start

ARRIVAL_TIMEOUT_S = 120
# After the last expected event, how long an event a filter should have left out is given
# to show up; the non-matching objects are written first, so they would be early.
GRACE_S = 3


def up() -> None:
    if State.load() is not None:
        step("A demo is already running: stopping it first")
        down(stop_services=False)
    state = State()
    state.save()

    step("Local services (the first run installs and builds them: minutes; later runs: seconds)")
    services = {name: _service(name) for name in ("kube", "ceph", "rabbitmq", "kafka")}
    kube, rgw = services["kube"], services["ceph"]
    kubectl = Kubectl.admin(kube)

    step("CRDs, the namespace and the buckets")
    kubectl.install_crds()
    if kubectl.run("get", "namespace", NAMESPACE, check=False).returncode != 0:
        kubectl.run("create", "namespace", NAMESPACE)
    info(f"namespace {NAMESPACE}")
    # Never retried: a retried PUT may notify twice, and the demo checks each event arrives once.
    s3 = gateway_client(rgw, "s3", **SINGLE_ATTEMPT)
    for bucket in (samples.BUCKET, QUEUE_BUCKET):
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
            s3.create_bucket(Bucket=bucket)
    info(f"bucket {samples.BUCKET} (the samples' notifications), bucket {QUEUE_BUCKET} (queues)")
    removed = report.clear_records(s3, QUEUE_BUCKET)
    if removed:
        info(f"removed {removed} delivery record files of an earlier run")

    stack = start_stack(state, kube, rgw)
    brokers = samples.Brokers(stack.receiver_url, services["rabbitmq"], services["kafka"])
    objs = samples.for_this_machine(samples.render(kube["KUBECTL"]), brokers, NAMESPACE)
    first_day = dt.datetime.now(dt.UTC).date()
    expected = _samples_and_events(kubectl, s3, objs, stack, services)

    step("Queue stats of the persistent Topics (bucketnotify topic stats)")
    show.topic_stats(
        [
            o["metadata"]["name"]
            for o in objs
            if o["kind"] == "Topic" and o["spec"].get("persistent")
        ],
        stack,
    )

    step("Metrics (excerpt; all of them: docs/metrics.md)")
    show.metrics(stack)

    step("The Spark report of the delivery records (docs/report.md)")
    events = sum(sum(want.values()) for want in expected.values())
    written = report.wait_records_written(
        [p["port"] for p in stack.replicas],
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
    show.report_summary(report.run_report(records_dir, report_dir, first_day, today))

    step("Running. Explore, then stop everything with `make demo-down`")
    info(f"export KUBECONFIG={kube['KUBECONFIG_ADMIN']}")
    info(f"kubectl get topics,bucketnotifications -n {NAMESPACE}")
    info(f".venv/bin/bucketnotify topic list -n {NAMESPACE}")
    info(f"tail -f {stack.received}")
    info(f"logs: {STATE_DIR}/*.log; `python -m demo status`")


def _service(name: str) -> Service:
    info(f"{name}: starting or reusing deploy/local/{name}.sh")
    return start(name)


def _samples_and_events(
    kubectl: Kubectl, s3: Any, objs: list[samples.Obj], stack: Stack, services: dict[str, Service]
) -> uploads.Expected:
    """Applies the samples, uploads the objects and shows the events arriving; what the
    filters had to let through, which arrived exactly so."""
    exchange, routing_key = samples.exchange_of(objs)
    kafka_topic = samples.kafka_topic_of(objs)
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
    watchers: list[arrivals.Watcher] = [
        arrivals.HttpWatcher(stack.received),
        arrivals.AmqpWatcher(services["rabbitmq"]["AMQP_URL"], exchange, routing_key),
        arrivals.KafkaWatcher(services["kafka"]["KAFKA_BOOTSTRAP"], kafka_topic),
    ]
    got = asyncio.run(_deliver(watchers, expected, apply_samples, upload))
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
    return expected


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
            subprocess.run(["bash", str(LOCAL / f"{name}.sh"), "stop"])


def _delete_amqp_queue() -> None:
    """The demo's queue, if RabbitMQ runs (its URL, guest's password included, is read from
    the service's env file rather than kept in the demo's state)."""
    env_file = RUN_DIR / "rabbitmq" / "env"
    if not env_file.exists():
        return
    asyncio.run(arrivals.delete_amqp_queue(read_env(env_file)["AMQP_URL"]))


def _kubectl_or_none() -> Kubectl | None:
    try:
        kube = start("kube")
    except ServiceError:
        return None
    return Kubectl.admin(kube)


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
