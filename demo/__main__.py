"""``python -m demo up|down|status``: bucketnotify running on this machine, for a person to see.

``up`` starts (or reuses) the real local services, then the operator, two delivery replicas
sharing a queue store on the gateway, and an HTTP endpoint; applies a Topic and a
BucketNotification; uploads objects and shows their events arriving, the queue stats, the
metrics and the report. Everything keeps running for the person to explore until ``down``.

The processes are started in sessions of their own, so they outlive this command; their pids
and ports are kept in ``$BN_RUN/demo/state.json`` for ``down`` and ``status``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.programs import free_port, wait_for_port
from bench.services import REPO, RUN_DIR, Service, ServiceError, start
from bench.workload import s3_client
from tests.kubectl import Kubectl
from tests.resources import apply

STATE_DIR = RUN_DIR / "demo"
STATE = STATE_DIR / "state.json"
NAMESPACE = "bucketnotify-demo"
BUCKET = "bucketnotify-demo"
QUEUE_BUCKET = "bucketnotify-demo-queues"
TOPIC = "orders"
EVENTS = 20
BIN = REPO / ".venv" / "bin"
# The metric families worth a first look; docs/metrics.md explains them all.
SHOWN_METRICS = (
    "pubsub_event_triggered",
    "pubsub_push_ok",
    "pubsub_push_failed",
    "pubsub_event_lost",
    "persistent_topic_len",
    "bucketnotify_delivery_latency_seconds_count",
)
OWNERSHIP_METRIC = "bucketnotify_lease_partitions_owned"


def step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def info(text: str) -> None:
    print(f"    {text}", flush=True)


class DemoError(RuntimeError):
    """The demo cannot go on; the message says what failed and where its log is."""


def _spawn(name: str, command: list[str], env: dict[str, str]) -> dict[str, Any]:
    log = STATE_DIR / f"{name}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            command,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
        )
    return {"name": name, "pid": process.pid, "log": str(log)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_port(port: int, proc: dict[str, Any]) -> None:
    try:
        wait_for_port(port, 90)
    except Exception as exc:
        raise DemoError(f"{proc['name']} does not listen on {port}; see {proc['log']}") from exc


def _services() -> dict[str, Service]:
    services = {}
    for name in ("kube", "ceph"):
        info(f"{name}: starting or reusing deploy/local/{name}.sh")
        services[name] = start(name)
    return services


def _ensure_bucket(client: Any, name: str) -> None:
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=name)


def _wait_ready(kubectl: Kubectl, kind: str, name: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    reason = "no status yet"
    while time.monotonic() < deadline:
        status = kubectl.get(kind, name, NAMESPACE).get("status") or {}
        ready = {c["type"]: c for c in status.get("conditions", [])}.get("Ready", {})
        if ready.get("status") == "True":
            return
        reason = f"{ready.get('reason')}: {ready.get('message')}" if ready else reason
        time.sleep(0.5)
    raise DemoError(f"{kind} {NAMESPACE}/{name} is not Ready after {timeout:.0f} s ({reason})")


def up() -> None:
    if STATE.exists():
        step("A demo is already running: stopping it first")
        down(stop_services=False)
    STATE_DIR.mkdir(parents=True, exist_ok=True)

    step("Local services (the first run builds the apiserver: minutes; later runs: seconds)")
    services = _services()
    kube, rgw = services["kube"], services["ceph"]
    kubectl = Kubectl(kube["KUBECTL"], kube["KUBECONFIG_ADMIN"])
    gateway_env = {
        "BUCKETNOTIFY_GATEWAY_ENDPOINT": rgw["RGW_ENDPOINT"],
        "BUCKETNOTIFY_GATEWAY_ACCESS_KEY": rgw["RGW_ACCESS_KEY"],
        "BUCKETNOTIFY_GATEWAY_SECRET_KEY": rgw["RGW_SECRET_KEY"],
        "BUCKETNOTIFY_GATEWAY_REGION": rgw.env.get("RGW_REGION") or "default",
    }

    step("CRDs and the namespace")
    kubectl.apply_path(REPO / "crds")
    kubectl.run("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    if kubectl.run("get", "namespace", NAMESPACE, check=False).returncode != 0:
        kubectl.run("create", "namespace", NAMESPACE)
    info(f"namespace {NAMESPACE}")

    s3 = s3_client(rgw)
    _ensure_bucket(s3, BUCKET)
    _ensure_bucket(s3, QUEUE_BUCKET)

    procs: list[dict[str, Any]] = []
    state: dict[str, Any] = {"processes": procs, "kubeconfig": kube["KUBECONFIG_ADMIN"]}

    def save() -> None:
        STATE.write_text(json.dumps(state, indent=2))

    step("An HTTP endpoint for the events")
    received = STATE_DIR / "received.jsonl"
    received.write_text("")
    receiver_port = free_port()
    receiver = _spawn(
        "receiver",
        [str(BIN / "python"), "-m", "demo.receiver", str(receiver_port), str(received)],
        {},
    )
    procs.append(receiver)
    save()
    _wait_port(receiver_port, receiver)
    info(f"http://127.0.0.1:{receiver_port}/ writes every event to {received}")

    step("Two delivery replicas sharing a queue store on the gateway")
    delivery_env = {
        "KUBECONFIG": kube["KUBECONFIG_ADMIN"],
        "BUCKETNOTIFY_DELIVERY_STORE": f"s3://{QUEUE_BUCKET}",
        "BUCKETNOTIFY_DELIVERY_LEASE_NAMESPACE": NAMESPACE,
        "BUCKETNOTIFY_DELIVERY_NAMESPACES": json.dumps([NAMESPACE]),
        **gateway_env,
    }
    replica_ports = []
    for identity in ("replica-1", "replica-2"):
        port = free_port()
        proc = _spawn(
            identity,
            [str(BIN / "bucketnotify"), "delivery"],
            {
                **delivery_env,
                "BUCKETNOTIFY_DELIVERY_IDENTITY": identity,
                "BUCKETNOTIFY_DELIVERY_LISTEN_PORT": str(port),
            },
        )
        proc["port"] = port
        procs.append(proc)
        replica_ports.append(port)
        save()
    for proc in procs[1:]:
        _wait_port(proc["port"], proc)
        info(f"{proc['name']}: ingest and /metrics on http://127.0.0.1:{proc['port']}")

    step("The operator")
    metrics_port = free_port()
    operator = _spawn(
        "operator",
        [str(BIN / "bucketnotify"), "operator"],
        {
            "KUBECONFIG": kube["KUBECONFIG_ADMIN"],
            **gateway_env,
            "BUCKETNOTIFY_NAMESPACES": json.dumps([NAMESPACE]),
            "BUCKETNOTIFY_LEADER_ELECTION_NAMESPACE": NAMESPACE,
            "BUCKETNOTIFY_INGEST_URL": f"http://127.0.0.1:{replica_ports[0]}",
            "BUCKETNOTIFY_METRICS_PORT": str(metrics_port),
        },
    )
    operator["port"] = metrics_port
    procs.append(operator)
    save()
    _wait_port(metrics_port, operator)
    info(f"operator: /metrics on http://127.0.0.1:{metrics_port}")

    step(f"Topic {TOPIC} (persistent, HTTP) and a BucketNotification on bucket {BUCKET}")
    apply(
        kubectl,
        NAMESPACE,
        "Topic",
        TOPIC,
        {"endpoint": {"http": {"url": f"http://127.0.0.1:{receiver_port}/"}}, "persistent": True},
    )
    _wait_ready(kubectl, "topic", TOPIC)
    info(f"topic {TOPIC}: Ready")
    apply(
        kubectl,
        NAMESPACE,
        "BucketNotification",
        "new-orders",
        {
            "bucket": BUCKET,
            "topicRef": {"name": TOPIC},
            "events": ["s3:ObjectCreated:*"],
            "filter": {"key": {"prefix": "orders/", "suffix": ".json"}},
        },
    )
    _wait_ready(kubectl, "bucketnotification", "new-orders")
    info("bucketnotification new-orders: Ready (prefix orders/, suffix .json)")

    step(f"Uploading {EVENTS} objects, and a few the filter leaves out")
    keys = [f"orders/{i:04d}.json" for i in range(EVENTS)]
    for key in keys:
        s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps({"order": key}).encode())
    for i in range(3):
        s3.put_object(Bucket=BUCKET, Key=f"invoices/{i}.pdf", Body=b"%PDF")
    info(f"{EVENTS} matching PUTs done")

    step("Events arriving at the endpoint")
    _show_arrivals(received, set(keys), timeout=120)

    step(f"Queue stats of topic {TOPIC} (bucketnotify topic stats {TOPIC} -n {NAMESPACE})")
    stats = subprocess.run(
        [str(BIN / "bucketnotify"), "topic", "stats", TOPIC, "-n", NAMESPACE],
        env={**os.environ, **delivery_env},
        capture_output=True,
        text=True,
        check=False,
    )
    print(_indent(stats.stdout or stats.stderr), flush=True)

    step("Metrics of the delivery replicas (excerpt; all of them: docs/metrics.md)")
    for port in replica_ports:
        info(f"http://127.0.0.1:{port}/metrics")
        print(_indent(_metrics_excerpt(port)), flush=True)

    step("Running. Explore, then stop everything with `make demo-down`")
    info(f"export KUBECONFIG={kube['KUBECONFIG_ADMIN']}")
    info(f"kubectl get topics,bucketnotifications -n {NAMESPACE}")
    info(f"tail -f {received}")
    info(f"logs: {STATE_DIR}/*.log")


def _show_arrivals(received: Path, expected: set[str], timeout: float) -> None:
    seen: set[str] = set()
    offset = 0
    deadline = time.monotonic() + timeout
    while seen != expected and time.monotonic() < deadline:
        with received.open() as f:
            f.seek(offset)
            for line in f:
                if not line.endswith("\n"):
                    break
                offset += len(line.encode())
                arrival = json.loads(line)
                record = arrival["record"]
                key = record["s3"]["object"]["key"]
                seen.add(key)
                info(f"{record['eventName']:<24} {key:<22} after {_latency(arrival)}")
        time.sleep(0.2)
    missing = expected - seen
    if missing:
        raise DemoError(
            f"{len(missing)} of {len(expected)} events did not arrive in {timeout:.0f} s; "
            f"see the replica and operator logs in {STATE_DIR}"
        )
    info(f"all {len(expected)} events arrived, each once; the 3 invoices/ objects were filtered")


def _latency(arrival: dict[str, Any]) -> str:
    from datetime import datetime

    try:
        at = datetime.fromisoformat(arrival["record"]["eventTime"].replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return "?"
    return f"{arrival['received_at'] - at.timestamp():.2f} s"


def _metrics_excerpt(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text: str = response.read().decode()
    lines = [
        line
        for line in text.splitlines()
        if (line.startswith(SHOWN_METRICS) and f'namespace="{NAMESPACE}"' in line)
        or line.startswith(OWNERSHIP_METRIC)
    ]
    return "\n".join(lines) or "(none yet)"


def _indent(text: str) -> str:
    return "\n".join(f"      {line}" for line in text.rstrip().splitlines())


def down(stop_services: bool = True) -> None:
    if STATE.exists():
        state = json.loads(STATE.read_text())
        procs = state["processes"]
        names = {p["name"]: p for p in procs}
        operator = names.get("operator")
        if operator and _alive(operator["pid"]):
            # While the operator runs its finalizers remove the gateway's topic and
            # notification; without it the deletion would wait forever.
            step("Deleting the demo's resources (the operator cleans the gateway)")
            kubectl = _kubectl_or_none()
            if kubectl is not None:
                for kind in ("bucketnotifications", "topics"):
                    kubectl.run(
                        "delete", kind, "--all", "-n", NAMESPACE, "--timeout=60s", check=False
                    )
        step("Stopping the demo's processes")
        for proc in reversed(procs):
            _stop(proc)
        STATE.unlink()
    else:
        info("no demo is running")
    if stop_services:
        step("Stopping the local services")
        for name in ("kafka", "rabbitmq", "ceph", "kube"):
            subprocess.run(["bash", str(REPO / "deploy" / "local" / f"{name}.sh"), "stop"])


def _kubectl_or_none() -> Kubectl | None:
    try:
        kube = start("kube")
    except ServiceError:
        return None
    return Kubectl(kube["KUBECTL"], kube["KUBECONFIG_ADMIN"])


def _stop(proc: dict[str, Any]) -> None:
    pid = proc["pid"]
    if not _alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while _alive(pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.2)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    info(f"{proc['name']} stopped")


def status() -> None:
    if not STATE.exists():
        info("no demo is running (`make demo` starts one)")
        return
    for proc in json.loads(STATE.read_text())["processes"]:
        state = "running" if _alive(proc["pid"]) else "EXITED"
        info(f"{proc['name']:<10} pid {proc['pid']:<8} {state:<8} log {proc['log']}")


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
        sys.exit(1)


if __name__ == "__main__":
    main()
