"""Operator benchmark: N Topics and N BucketNotifications reconciled, then deleted.

``python -m bench.operator_scale [--topics 1000] [--notifications 1000] [--buckets 10]``
(``make bench``). The real operator runs as a subprocess against the local apiserver and
gateway, watching a fresh namespace. The Topics (non-persistent HTTP, or ``--persistent``)
are applied in one server-side ``kubectl apply`` of a List, and timed until every one is
Ready; then the BucketNotifications (notification i on topic i mod N, bucket i mod B, each
its own ``Id``) the same way; then both kinds are deleted at once and timed until the
finalizers let the last one go. Progress is read with one LIST per kind a second.

Figures per phase: seconds to all Ready (or gone), objects per second and milliseconds per
object, when objects became Ready (p50/p90/max from the apply, to the second), the
operator's CPU seconds, its resident memory (peak: ``VmHWM``), its handler runs (its own
metrics), CPU seconds of the apiserver, etcd and radosgw, and the requests radosgw served
(its perf counters: every client of the shared gateway, not only the operator). A baseline
makes the same gateway writes directly, one client, one after another, so the ratio says
what reconciling through Kubernetes costs over the bare gateway calls; it also times the same
``kubectl apply`` runs into a namespace no operator watches, the part of each phase that is
the API server's alone.

The gateway must be as clean afterwards as before: no gateway topic (``radosgw-admin topic
list``, which also lists the per-notification topics Ceph 16 makes) naming this run's
namespace or tag may remain, and the buckets' notification configurations must be empty.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from prometheus_client.parser import text_string_to_metric_families

from bench.delivery import OPERATOR_LEASE, source_revision
from bench.gateway import Gateway
from bench.guarded import guarded
from bench.kube import Kubectl, SetupError, new_namespace, wait_lease_held
from bench.workload import s3_client
from devstack import services
from devstack.gateway import gateway_settings
from devstack.programs import Program, ProgramDied, cpu_seconds, free_port
from devstack.services import REPO, Service

API = "bucketnotify.io/v1alpha1"
PLURALS = {"Topic": "topics", "BucketNotification": "bucketnotifications"}
EVENT = "s3:ObjectCreated:Put"
POLL_INTERVAL_S = 1.0
# One drift interval of the operator (60 s by default) and a margin: every object's drift
# check falls in the window once.
STEADY_S = 65.0


@dataclass(frozen=True)
class Options:
    topics: int
    notifications: int
    buckets: int
    persistent: bool
    timeout: float
    idle_timeout: float
    baseline: bool
    watch_namespaces: int = 1
    """Namespaces the operator is scoped to: the objects' one and empty others. Each costs
    kopf three watch streams, each a connection of its pool."""


@dataclass
class Observed:
    """What the LISTs showed about one kind during a phase."""

    first_ready: dict[str, float] = field(default_factory=dict)
    """object name -> seconds from the apply (or delete) to the first LIST showing it done."""
    reasons: Counter[str] = field(default_factory=Counter)
    """Ready reasons of the objects not done at the last LIST."""
    lists: int = 0
    list_seconds: float = 0.0


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak resident set) of a live process, in KiB."""
    found: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0])
    return found


def service_pids(operator: Program) -> dict[str, int | None]:
    return {
        "operator": operator.pid,
        "kube-apiserver": services.pid_of("kube", "apiserver.pid"),
        "etcd": services.pid_of("kube", "etcd.pid"),
        "radosgw": services.pid_of("ceph", "rgw.pid"),
        "ceph-osd": services.pid_of("ceph", "osd.pid"),
    }


def handler_runs(metrics_url: str) -> dict[str, float]:
    """The operator's ``bucketnotify_reconcile_total`` as "kind/action/result" -> runs
    (empty when the operator does not answer: the figure is missing, not the run)."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=10) as response:  # noqa: S310
            text = response.read().decode()
    except OSError:
        return {}
    runs: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "bucketnotify_reconcile_total":
                labels = sample.labels
                runs[f"{labels['kind']}/{labels['action']}/{labels['result']}"] = sample.value
            elif sample.name in (
                "bucketnotify_bucket_writes_total",
                "bucketnotify_bucket_write_notifications_total",
            ):
                # Bucket configuration writes and the notifications in them.
                runs[sample.name.removeprefix("bucketnotify_").removesuffix("_total")] = (
                    sample.value
                )
    return runs


# --- the objects ----------------------------------------------------------------------------


def topic_name(i: int) -> str:
    return f"t-{i:05d}"


def notification_name(i: int) -> str:
    return f"n-{i:05d}"


def topics(options: Options) -> list[dict[str, Any]]:
    objects = []
    for i in range(options.topics):
        # Nothing listens there, and nothing is sent: no object is written to the buckets.
        spec: dict[str, Any] = {
            "endpoint": {"http": {"url": f"http://127.0.0.1:9/{topic_name(i)}"}},
            "persistent": options.persistent,
        }
        objects.append(
            {"apiVersion": API, "kind": "Topic", "metadata": {"name": topic_name(i)}, "spec": spec}
        )
    return objects


def notifications(options: Options, buckets: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": API,
            "kind": "BucketNotification",
            "metadata": {"name": notification_name(i)},
            "spec": {
                "bucket": buckets[i % len(buckets)],
                "topicRef": {"name": topic_name(i % options.topics)},
                "events": [EVENT],
                "testEvent": False,
            },
        }
        for i in range(options.notifications)
    ]


# --- kubectl in bulk ------------------------------------------------------------------------


def kubectl_bulk(
    kubectl: Kubectl, *args: str, stdin: str | None = None, timeout: float = 1800
) -> str:
    # Not Kubectl.run: its 2-minute limit is for single objects, not a thousand of them.
    result = subprocess.run(
        [kubectl.binary, "--kubeconfig", kubectl.kubeconfig, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise SetupError(f"kubectl {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return result.stdout


def apply_list(kubectl: Kubectl, namespace: str, objects: list[dict[str, Any]]) -> None:
    document = {"apiVersion": "v1", "kind": "List", "items": objects}
    kubectl_bulk(
        kubectl,
        "apply",
        "--server-side",
        "--field-manager=bench",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=json.dumps(document),
    )


def list_objects(kubectl: Kubectl, namespace: str, kind: str) -> list[dict[str, Any]]:
    # --raw: the apiserver's JSON as is; kubectl's own decoding and printing of a thousand
    # objects a second would compete with the operator for this machine's two cores.
    out = kubectl_bulk(
        kubectl, "get", "--raw", f"/apis/{API}/namespaces/{namespace}/{PLURALS[kind]}", timeout=120
    )
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def ready_reason(obj: dict[str, Any]) -> tuple[bool, str]:
    conditions = (obj.get("status") or {}).get("conditions") or []
    ready = {c.get("type"): c for c in conditions}.get("Ready")
    if ready is None:
        return False, "NoStatusYet"
    return ready.get("status") == "True", str(ready.get("reason"))


# --- phases ---------------------------------------------------------------------------------


class Phase:
    """One timed phase: resource usage around it, progress polled with LISTs."""

    def __init__(self, name: str, operator: Program, gateway: Gateway, metrics_url: str) -> None:
        self.name = name
        self.operator = operator
        self.gateway = gateway
        self.metrics_url = metrics_url
        self.pids = service_pids(operator)
        self.observed: dict[str, Observed] = {}
        self.rss_peak_sampled_kib = 0
        self.result: dict[str, Any] = {"phase": name}

    def __enter__(self) -> Phase:
        self.cpu_before = {n: cpu_seconds(p) for n, p in self.pids.items()}
        self.requests_before = self.gateway.requests()
        self.runs_before = handler_runs(self.metrics_url)
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        cpu_after = {n: cpu_seconds(p) for n, p in self.pids.items()}
        cpu: dict[str, float | None] = {}
        for name, before in self.cpu_before.items():
            after = cpu_after.get(name)
            cpu[name] = None if before is None or after is None else round(after - before, 2)
        requests = self.gateway.requests()
        runs_after = handler_runs(self.metrics_url)
        memory = memory_kib(self.operator.pid)
        self.result.update(
            {
                "cpu_s": cpu,
                "radosgw_requests": (
                    requests - self.requests_before
                    if requests is not None and self.requests_before is not None
                    else None
                ),
                "handler_runs": {
                    k: v - self.runs_before.get(k, 0)
                    for k, v in sorted(runs_after.items())
                    if v - self.runs_before.get(k, 0)
                },
                "operator_rss_end_mib": round(memory.get("VmRSS", 0) / 1024, 1),
                "operator_rss_peak_mib": round(memory.get("VmHWM", 0) / 1024, 1),
                "load_average_1m": round(os.getloadavg()[0], 2),
            }
        )

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def wait(
        self,
        kubectl: Kubectl,
        namespace: str,
        expected: dict[str, set[str]],
        done: Callable[[dict[str, Any]], bool],
        options: Options,
    ) -> None:
        """Poll until ``done`` holds for every expected object of each kind (an object
        missing from the LIST is given as ``{}``)."""
        for kind in expected:
            self.observed[kind] = Observed()
        last_progress = time.monotonic()
        while True:
            remaining = 0
            for kind, names in expected.items():
                seen = self.observed[kind]
                started = time.monotonic()
                items = {o["metadata"]["name"]: o for o in list_objects(kubectl, namespace, kind)}
                seen.lists += 1
                seen.list_seconds += time.monotonic() - started
                now = self.elapsed()
                seen.reasons = Counter()
                for name in names:
                    if name in seen.first_ready:
                        continue
                    obj = items.get(name, {})
                    if done(obj):
                        seen.first_ready[name] = now
                        last_progress = time.monotonic()
                    else:
                        seen.reasons[ready_reason(obj)[1] if obj else "Missing"] += 1
                remaining += len(names) - len(seen.first_ready)
            rss = memory_kib(self.operator.pid).get("VmRSS", 0)
            self.rss_peak_sampled_kib = max(self.rss_peak_sampled_kib, rss)
            if remaining == 0:
                break
            self.operator.check_alive()
            if self.elapsed() > options.timeout:
                raise SetupError(
                    f"{self.name}: {remaining} objects not done after "
                    f"{options.timeout:.0f} s: {self.reasons()}"
                )
            if time.monotonic() - last_progress > options.idle_timeout:
                raise SetupError(
                    f"{self.name}: no progress for {options.idle_timeout:.0f} s with "
                    f"{remaining} objects left: {self.reasons()}"
                )
            time.sleep(POLL_INTERVAL_S)
        self.summarise(expected)

    def reasons(self) -> dict[str, dict[str, int]]:
        """Why the objects not done yet are not, by kind: the 5 commonest Ready reasons."""
        return {k: dict(o.reasons.most_common(5)) for k, o in self.observed.items()}

    def summarise(self, expected: dict[str, set[str]]) -> None:
        total = sum(len(n) for n in expected.values())
        seconds = max(
            (t for o in self.observed.values() for t in o.first_ready.values()), default=0
        )
        times = sorted(t for o in self.observed.values() for t in o.first_ready.values())

        def rank(q: float) -> float | None:
            return round(times[max(0, math.ceil(q * len(times)) - 1)], 1) if times else None

        self.result.update(
            {
                "objects": total,
                "seconds": round(seconds, 1),
                "objects_per_s": round(total / seconds, 2) if seconds else None,
                "ms_per_object": round(1000 * seconds / total, 1) if total else None,
                "done_at_s": {"p50": rank(0.5), "p90": rank(0.9), "max": rank(1.0)},
                "lists": {k: o.lists for k, o in self.observed.items()},
                "list_seconds": {k: round(o.list_seconds, 1) for k, o in self.observed.items()},
                "operator_rss_peak_sampled_mib": round(self.rss_peak_sampled_kib / 1024, 1),
            }
        )


def is_ready(obj: dict[str, Any]) -> bool:
    return bool(obj) and ready_reason(obj)[0]


def gone(obj: dict[str, Any]) -> bool:
    return not obj


def run_phase(
    name: str,
    operator: Program,
    gateway: Gateway,
    metrics_url: str,
    action: Callable[[], None],
    wait: Callable[[Phase], None],
    into: list[dict[str, Any]],
) -> None:
    """Run one phase; its result goes ``into`` the list even when it failed."""
    print(f"== {name}", flush=True)
    phase = Phase(name, operator, gateway, metrics_url)
    into.append(phase.result)
    with phase:
        try:
            action()
            phase.result["command_s"] = round(phase.elapsed(), 1)
            print(f"  kubectl done after {phase.result['command_s']} s; waiting ...", flush=True)
            wait(phase)
        except Exception as exc:
            phase.result["error"] = f"{type(exc).__name__}: {exc}"
            phase.result["not_done"] = phase.reasons()
            raise
    r = phase.result
    print(
        f"  {r['objects']} objects in {r['seconds']} s ({r['objects_per_s']}/s), operator "
        f"CPU {r['cpu_s'].get('operator')} s, RSS peak {r['operator_rss_peak_mib']} MiB",
        flush=True,
    )


# --- baseline: the same gateway writes without Kubernetes ---------------------------------


class Retrying:
    """Calls retried on the gateway's 500s, counted.

    Ceph 16.2 answers 500 when two writers change one user's topics at once (other
    developers' tests share this gateway), so even one client meets them.
    """

    ATTEMPTS = 20

    def __init__(self) -> None:
        self.retries = 0

    def __call__(self, call: Callable[..., Any], **kwargs: Any) -> Any:
        for attempt in range(1, self.ATTEMPTS + 1):
            try:
                return call(**kwargs)
            except ClientError as exc:
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
                if status < 500 or attempt == self.ATTEMPTS:
                    raise
                self.retries += 1
                time.sleep(0.05 * attempt)
        raise AssertionError("unreachable")


def baseline(rgw: Service, options: Options, tag: str) -> dict[str, Any]:
    """CreateTopic N times, PUT N notification configurations, DeleteTopic N times: one
    client, one request after another, on buckets of their own (deleted at the end)."""
    sns, s3 = s3_client(rgw, "sns"), s3_client(rgw, "s3")
    retrying = Retrying()
    buckets = [f"bno-{tag}-direct-{b}" for b in range(options.buckets)]
    for bucket in buckets:
        s3.create_bucket(Bucket=bucket)
    arns: list[str] = []
    result: dict[str, Any] = {}
    try:
        started = time.monotonic()
        for i in range(options.topics):
            name = f"bno-{tag}-direct-{topic_name(i)}"
            attributes = {
                "push-endpoint": f"http://127.0.0.1:9/{topic_name(i)}",
                "persistent": "true" if options.persistent else "false",
            }
            created = retrying(sns.create_topic, Name=name, Attributes=attributes)
            arns.append(created["TopicArn"])
        result["create_topics_s"] = round(time.monotonic() - started, 2)
        started = time.monotonic()
        for i in range(options.notifications):
            # Ceph 16.2 keeps the bucket's other Ids on a PUT (docs/gateway-compatibility.md).
            retrying(
                s3.put_bucket_notification_configuration,
                Bucket=buckets[i % len(buckets)],
                NotificationConfiguration={
                    "TopicConfigurations": [
                        {
                            "Id": f"bno-{tag}-direct-{notification_name(i)}",
                            "TopicArn": arns[i % len(arns)],
                            "Events": [EVENT],
                        }
                    ]
                },
            )
        result["put_notifications_s"] = round(time.monotonic() - started, 2)
    finally:
        # What fails here is found and removed by the leftover check at the end of the run.
        started = time.monotonic()
        for arn in arns:
            retrying(sns.delete_topic, TopicArn=arn)
        result["delete_topics_s"] = round(time.monotonic() - started, 2)
        # Removing a bucket removes its notifications (and their copies of the topic).
        for bucket in buckets:
            retrying(s3.delete_bucket, Bucket=bucket)
        result["retried_500s"] = retrying.retries
    return result


def apply_alone(kubectl: Kubectl, options: Options, buckets: list[str]) -> dict[str, Any]:
    """The same two ``kubectl apply`` runs into a namespace no operator watches: what the
    API server alone takes for them on this machine, the floor under every phase's time
    (a phase is timed from the start of its apply)."""
    namespace = new_namespace(kubectl, "bench-apply")
    result: dict[str, Any] = {}
    started = time.monotonic()
    apply_list(kubectl, namespace, topics(options))
    result["apply_topics_s"] = round(time.monotonic() - started, 2)
    started = time.monotonic()
    apply_list(kubectl, namespace, notifications(options, buckets))
    result["apply_notifications_s"] = round(time.monotonic() - started, 2)
    # No finalizer was ever added, so the objects go at once.
    kubectl_bulk(
        kubectl, "delete", "bucketnotifications,topics", "--all", "-n", namespace, "--wait=false"
    )
    return result


# --- set-up and clean-up --------------------------------------------------------------------


@contextlib.contextmanager
def buckets_of_the_run(rgw: Service, tag: str, count: int) -> Iterator[list[str]]:
    s3 = s3_client(rgw)
    names = [f"bno-{tag}-{b}" for b in range(count)]
    for name in names:
        s3.create_bucket(Bucket=name)
    try:
        yield names
    finally:
        for name in names:
            try:
                s3.delete_bucket(Bucket=name)
            except Exception as exc:
                print(f"  warning: deleting bucket {name} failed: {exc}", flush=True)


def leftover_configurations(rgw: Service, buckets: list[str]) -> dict[str, int]:
    s3 = s3_client(rgw)
    found = {}
    for bucket in buckets:
        config = s3.get_bucket_notification_configuration(Bucket=bucket)
        if config.get("TopicConfigurations"):
            found[bucket] = len(config["TopicConfigurations"])
    return found


def release_leftovers(
    kubectl: Kubectl, namespace: str, rgw: Service, marks: list[str]
) -> list[str]:
    """After a failed run, with the operator stopped: what it did not remove, removed.

    Finalizers are dropped (the namespace is abandoned anyway) and the gateway topics of
    the run deleted directly, so a failed benchmark does not leave the shared gateway fuller.
    """
    for kind in PLURALS.values():
        items = json.loads(kubectl_bulk(kubectl, "get", kind, "-n", namespace, "-o", "json"))[
            "items"
        ]

        def release(obj: dict[str, Any], kind: str = kind) -> None:
            kubectl.run(
                "patch",
                kind,
                obj["metadata"]["name"],
                "-n",
                namespace,
                "--type=merge",
                "-p",
                '{"metadata":{"finalizers":[]}}',
                check=False,
            )

        # A kubectl each, several at once: at 10,000 objects one after another takes an hour.
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(release, items))
        kubectl.run("delete", kind, "--all", "-n", namespace, "--wait=false", check=False)
    gateway = Gateway(rgw)
    sns = s3_client(rgw, "sns")
    removed = []
    region = rgw.env.get("RGW_REGION") or "default"
    for name in gateway.topic_names(*marks):
        with contextlib.suppress(Exception):
            sns.delete_topic(TopicArn=f"arn:aws:sns:{region}::{name}")
            removed.append(name)
    return removed


def operator_env(
    kube: Service, rgw: Service, namespaces: list[str], metrics_port: int
) -> dict[str, str]:
    namespace = namespaces[0]
    return {
        "KUBECONFIG": kube["KUBECONFIG_ADMIN"],
        **gateway_settings(rgw),
        "BUCKETNOTIFY_NAMESPACES": json.dumps(namespaces),
        "BUCKETNOTIFY_LEADER_ELECTION_NAMESPACE": namespace,
        # Persistent Topics point the gateway here; no object is written, nothing is pushed.
        "BUCKETNOTIFY_INGEST_URL": "http://127.0.0.1:9",
        "BUCKETNOTIFY_METRICS_PORT": str(metrics_port),
    }


def delete_both(kubectl: Kubectl, namespace: str) -> None:
    # As a user (or a GitOps prune) would: both kinds at once, finalizers left to the operator.
    kubectl_bulk(
        kubectl, "delete", "bucketnotifications,topics", "--all", "-n", namespace, "--wait=false"
    )


def measure(
    options: Options, rgw: Service, kube: Service, out: Path, run_id: str
) -> dict[str, Any]:
    kubectl = Kubectl.admin(kube)
    kubectl.install_crds()
    gateway = Gateway(rgw)
    tag = uuid.uuid4().hex[:6]
    namespace = new_namespace(kubectl, "bench-operator")
    marks = [namespace, f"bno-{tag}"]
    print(f"namespace {namespace}, gateway names of this run contain {marks}", flush=True)
    watched = [namespace] + [
        new_namespace(kubectl, "bench-empty") for _ in range(options.watch_namespaces - 1)
    ]
    document: dict[str, Any] = {
        "namespace": namespace,
        "watch_namespaces": len(watched),
        "tag": tag,
        "phases": [],
    }
    document["gateway_topics_before"] = len(gateway.topic_names(""))

    if options.baseline:
        print("== baseline: the same gateway writes, direct, one client", flush=True)
        try:
            document["baseline"] = baseline(rgw, options, tag)
            print(f"  {document['baseline']}", flush=True)
            buckets = [f"bno-{tag}-{b}" for b in range(options.buckets)]
            alone = apply_alone(kubectl, options, buckets)
            document["baseline"].update(alone)
            print(f"  kubectl apply alone, no operator: {alone}", flush=True)
        except (BotoCoreError, ClientError) as exc:
            document["baseline_error"] = f"{type(exc).__name__}: {exc}"
            print(f"  baseline FAILED: {document['baseline_error']}", flush=True)

    log_dir = out / f"{run_id}-operator-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    metrics_port = free_port()
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    topic_objects = topics(options)
    topic_names = {o["metadata"]["name"] for o in topic_objects}
    with buckets_of_the_run(rgw, tag, options.buckets) as buckets:
        notification_objects = notifications(options, buckets)
        notification_names = {o["metadata"]["name"] for o in notification_objects}
        operator = Program(
            ["operator"],
            operator_env(kube, rgw, watched, metrics_port),
            name="operator",
            log_dir=log_dir,
        )
        document["operator_log"] = str(operator.log_path)
        phases: list[dict[str, Any]] = document["phases"]

        def phase(name: str, action: Callable[[], None], wait: Callable[[Phase], None]) -> None:
            run_phase(name, operator, gateway, metrics_url, action, wait, phases)

        cleaned = False
        try:
            if not wait_lease_held(kubectl, namespace, OPERATOR_LEASE, 120):
                operator.check_alive()
                raise SetupError(f"the operator took no Lease {OPERATOR_LEASE} in 120 s")
            document["operator_rss_idle_mib"] = round(
                memory_kib(operator.pid).get("VmRSS", 0) / 1024, 1
            )
            phase(
                "create topics",
                lambda: apply_list(kubectl, namespace, topic_objects),
                lambda p: p.wait(kubectl, namespace, {"Topic": topic_names}, is_ready, options),
            )
            phase(
                "create notifications",
                lambda: apply_list(kubectl, namespace, notification_objects),
                lambda p: p.wait(
                    kubectl,
                    namespace,
                    {"BucketNotification": notification_names},
                    is_ready,
                    options,
                ),
            )
            document["gateway_topics_of_the_run_while_ready"] = len(gateway.topic_names(*marks))
            print(f"== steady state: {STEADY_S:.0f} s, every object Ready, no change", flush=True)
            with Phase("steady state", operator, gateway, metrics_url) as steady:
                time.sleep(STEADY_S)
                operator.check_alive()
            document["steady"] = {**steady.result, "seconds": STEADY_S}
            phase(
                "delete both",
                lambda: delete_both(kubectl, namespace),
                lambda p: p.wait(
                    kubectl,
                    namespace,
                    {"BucketNotification": notification_names, "Topic": topic_names},
                    gone,
                    options,
                ),
            )
            cleaned = True
        except (SetupError, ProgramDied, subprocess.TimeoutExpired) as exc:
            traceback.print_exc()
            document["error"] = f"{type(exc).__name__}: {exc}"
            print(f"--- operator log ({operator.log_path}) ends:\n{operator.tail(30)}")
        finally:
            if not cleaned:
                # Let the running operator remove what it can before it goes.
                with contextlib.suppress(Exception):
                    delete_both(kubectl, namespace)
                    with Phase("clean-up", operator, gateway, metrics_url) as cleanup:
                        cleanup.wait(
                            kubectl,
                            namespace,
                            {"BucketNotification": notification_names, "Topic": topic_names},
                            gone,
                            options,
                        )
            operator.stop()
            if not cleaned:
                document["released_after_failure"] = release_leftovers(
                    kubectl, namespace, rgw, marks
                )
            # A figure of the run (what the operator failed to remove), then removed, so
            # that the shared gateway is as clean as before.
            document["leftover_gateway_topics"] = gateway.topic_names(*marks)
            document["leftover_bucket_configurations"] = leftover_configurations(rgw, buckets)
            if document["leftover_gateway_topics"]:
                gateway.remove(document["leftover_gateway_topics"])
    document["gateway_topics_after"] = len(gateway.topic_names(""))
    return document


# --- report ---------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(document: dict[str, Any], options: Options) -> str:
    header = (
        f"{'phase':<22}{'objects':>8}{'s':>8}{'obj/s':>8}{'ms/obj':>8}{'p50 s':>7}{'p90 s':>7}"
        f"{'op CPU s':>9}{'CPU ms/obj':>11}{'RSS MiB':>8}{'peak':>7}{'rgw req':>8}"
        f"{'apisrv':>7}{'etcd':>6}{'rgw':>6}{'load':>6}"
    )
    lines = [
        f"operator watching {document.get('watch_namespaces', 1)} namespace(s)",
        header,
        "-" * len(header),
    ]
    for r in document["phases"]:
        if "error" in r:
            lines.append(f"{r['phase']:<22}FAILED: {r['error'][:100]}")
            continue
        cpu = r["cpu_s"]
        op_cpu = cpu.get("operator")
        lines.append(
            f"{r['phase']:<22}{r['objects']:>8}{_num(r['seconds']):>8}"
            f"{_num(r['objects_per_s']):>8}{_num(r['ms_per_object']):>8}"
            f"{_num(r['done_at_s']['p50'], 0):>7}{_num(r['done_at_s']['p90'], 0):>7}"
            f"{_num(op_cpu):>9}"
            f"{_num(1000 * op_cpu / r['objects'] if op_cpu is not None else None):>11}"
            f"{_num(r['operator_rss_end_mib'], 0):>8}{_num(r['operator_rss_peak_mib'], 0):>7}"
            f"{r['radosgw_requests'] if r['radosgw_requests'] is not None else '-':>8}"
            f"{_num(cpu.get('kube-apiserver'), 0):>7}{_num(cpu.get('etcd'), 0):>6}"
            f"{_num(cpu.get('radosgw'), 0):>6}{_num(r['load_average_1m']):>6}"
        )
    phases = {r["phase"]: r for r in document["phases"] if "error" not in r}
    base = document.get("baseline")
    created = [phases.get("create topics"), phases.get("create notifications")]
    if all(created):
        total = sum(p["seconds"] for p in created if p)
        lines.append(
            f"\n{options.topics} Topics + {options.notifications} BucketNotifications all Ready"
            f" in {total:.1f} s ({(options.topics + options.notifications) / total:.1f} objects/s);"
            f" operator RSS {document.get('operator_rss_idle_mib')} MiB idle,"
            f" {max(p['operator_rss_peak_mib'] for p in created if p)} MiB peak"
        )
        last: dict[str, Any] = created[-1] or {}
        idle, peak = document.get("operator_rss_idle_mib"), last["operator_rss_end_mib"]
        if idle is not None:
            objects = (options.topics + options.notifications) / 1000
            lines.append(
                f"operator RSS growth: {(peak - idle) / objects:.1f} MiB per 1,000 objects"
                f" (resident with all Ready {peak} MiB, idle before {idle} MiB;"
                " goal: peak <= 200 MiB at 2,000)"
            )
    steady = document.get("steady")
    if steady:
        seconds, op_cpu = steady["seconds"], steady["cpu_s"].get("operator")
        requests = steady["radosgw_requests"]
        lines.append(
            f"steady state ({seconds:.0f} s, all Ready): operator"
            f" {_num(100 * op_cpu / seconds if op_cpu is not None else None)} % of a core"
            f" (goal <= 5 %), gateway {_num(requests / seconds if requests is not None else None)}"
            " requests/s (goal <= 20/s; every client of the shared gateway), handler runs"
            f" {steady['handler_runs']}"
        )
    notes = phases.get("create notifications")
    if notes:
        writes = notes["handler_runs"].get("bucket_writes")
        written = notes["handler_runs"].get("bucket_write_notifications")
        if writes:
            lines.append(
                f"bucket configuration writes: {writes:.0f} for {written:.0f} notifications"
                f" ({written / writes:.2f} written together on average)"
            )
    if base and all(created):
        topics_phase, notes_phase = created
        assert topics_phase is not None and notes_phase is not None
        lines += [
            "",
            "ratios operator (apply to all Ready) / the same gateway writes made directly"
            " (one client, sequential); goal: <= 1.5 for Topics and BucketNotifications",
            f"  Topics:               {topics_phase['seconds']:.1f} s / "
            f"{base['create_topics_s']:.1f} s = "
            f"{topics_phase['seconds'] / base['create_topics_s']:.2f}"
            f"{_floor(base, 'apply_topics_s', 'create_topics_s')}",
            f"  BucketNotifications:  {notes_phase['seconds']:.1f} s / "
            f"{base['put_notifications_s']:.1f} s = "
            f"{notes_phase['seconds'] / base['put_notifications_s']:.2f}"
            f"{_floor(base, 'apply_notifications_s', 'put_notifications_s')}",
        ]
        deleted = phases.get("delete both")
        if deleted:
            lines.append(
                f"  delete both:          {deleted['seconds']:.1f} s / "
                f"{base['delete_topics_s']:.1f} s (DeleteTopic only) = "
                f"{deleted['seconds'] / base['delete_topics_s']:.2f}"
            )
    left = document.get("leftover_gateway_topics") or []
    if left or document.get("leftover_bucket_configurations"):
        lines.append(
            f"\nWARNING: the operator's clean-up left {len(left)} gateway topics (removed now"
            f" by the benchmark with radosgw-admin topic rm), e.g. {left[:3]}"
        )
    lines.append(
        f"\ngateway topics of this run left: {len(left)};"
        f" bucket configurations left: {document.get('leftover_bucket_configurations')};"
        f" gateway topics (all users) before {document.get('gateway_topics_before')},"
        f" after {document.get('gateway_topics_after')}"
    )
    return "\n".join(lines)


# --- entry point ----------------------------------------------------------------------------


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _floor(base: dict[str, Any], apply_key: str, direct_key: str) -> str:
    """The ratio the kubectl apply alone already reaches (no operator running)."""
    if apply_key not in base:
        return ""
    return (
        f" (the apply alone, no operator: {base[apply_key]:.1f} s ="
        f" {base[apply_key] / base[direct_key]:.2f})"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.operator_scale",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--topics", type=int, default=1000, help="Topics to reconcile")
    parser.add_argument(
        "--notifications", type=int, default=1000, help="BucketNotifications to reconcile"
    )
    parser.add_argument(
        "--buckets", type=int, default=10, help="buckets the notifications are spread over"
    )
    parser.add_argument(
        "--persistent",
        action="store_true",
        help="persistent Topics (ingest token Secret each, persistent gateway topic)",
    )
    parser.add_argument(
        "--timeout", type=float, default=1800.0, help="seconds a phase may take at most"
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=300.0,
        help="give a phase up after this many seconds without an object done",
    )
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the direct gateway writes baseline"
    )
    parser.add_argument(
        "--watch-namespaces",
        type=int,
        default=1,
        help="namespaces the operator watches: the objects' one and empty others",
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "results", help="directory of the results"
    )
    args = parser.parse_args(argv)
    if args.watch_namespaces < 1:
        parser.error("--watch-namespaces must be at least 1")
    if args.topics < 1 or args.notifications < 0 or args.buckets < 1:
        parser.error("--topics and --buckets must be at least 1, --notifications at least 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    options = Options(
        topics=args.topics,
        notifications=args.notifications,
        buckets=args.buckets,
        persistent=args.persistent,
        timeout=args.timeout,
        idle_timeout=args.idle_timeout,
        baseline=not args.no_baseline,
        watch_namespaces=args.watch_namespaces,
    )
    run_id = time.strftime("%Y%m%d-%H%M%S")
    load_before = os.getloadavg()

    def benchmark(started: list[Service]) -> int:
        code = 0
        rgw = services.start("ceph")
        started.append(rgw)
        kube = services.start("kube")
        started.append(kube)
        measured = measure(options, rgw, kube, args.out, run_id)
        if "error" in measured:
            code = 1
        document = {
            "benchmark": "operator",
            "started": run_id,
            "host": {
                "cpus": os.cpu_count(),
                "load_average_before": load_before,
                "load_average_after": os.getloadavg(),
                "python": platform.python_version(),
                "platform": platform.platform(),
            },
            "source": source_revision(),
            "options": asdict(options),
            **measured,
        }
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"{run_id}-operator.json"
        path.write_text(json.dumps(document, indent=2) + "\n")
        print()
        print(
            f"operator benchmark: {options.topics} Topics"
            f"{' (persistent)' if options.persistent else ''}, {options.notifications}"
            f" BucketNotifications on {options.buckets} buckets; {os.cpu_count()} CPUs, load"
            f" average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after"
        )
        if "error" in measured:
            print(f"FAILED: {measured['error']}")
        print(report(document, options))
        print(f"\nresults: {path}")
        return code

    return guarded("bench", benchmark)


if __name__ == "__main__":
    sys.exit(main())
