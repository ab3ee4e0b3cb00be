"""Scale: ten thousand Topics and BucketNotifications, the operator and two delivery replicas.

``python -m bench.scale [--topics 10000] [--notifications 10000] [--buckets 1000]
[--replicas 2] [--steady 600] [--profile]`` (``make bench``: ``SCALE_ARGS``). The whole system
runs against the local apiserver and gateway: the operator (default drift interval), the
replicas behind a round-robin proxy with their queues in the S3 store, and one namespace
holding everything. Half the Topics (the even ones) are persistent, so each of them has an
ingest-token Secret and a place in every replica's Topic table; BucketNotification i is on
Topic i and bucket i mod ``--buckets``. Both kinds are applied as users apply them: one
server-side ``kubectl apply`` of a List each.

First one probe Topic (persistent, its own bucket and BucketNotification) and nine quiet
ones are set up, and ``--probes`` events are timed on the probe from the PUT's start to the
endpoint with ten Topics in the system. Then, phase by phase (create Topics, create
BucketNotifications, steady state, delete both): seconds to all Ready (or gone); the CPU
seconds of the operator, each replica, the apiserver, etcd and radosgw, and per object; the
peak RSS of the operator and each replica; the apiserver's requests (its own
``apiserver_request_total``, watches excluded; the benchmark's own progress LISTs are counted
apart) and the gateway's (radosgw's ``rgw.req``, all clients, and the operator's by
operation from ``bucketnotify_gateway_requests_total``). The steady state lasts ``--steady``
seconds with every object Ready and nothing changing: the operator's gateway requests per
drift interval against the goal (1.2 per bucket holding BucketNotifications plus the
ListTopics pages), apiserver requests per second, each process's share of a core. Then the
probe's events are timed again with all the Topics idle. Last, everything is deleted and
the gateway checked: no gateway topic naming the run, every bucket's configuration empty.

``--profile`` samples the operator and the replicas with py-spy through the create phases
and the steady state and prints each one's top frames (own and inclusive samples).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import time
import traceback
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from bench.delivery import PARTITIONS, _best_effort, source_revision
from bench.gateway import Gateway
from bench.guarded import guarded
from bench.idle import start_replicas
from bench.kube import SetupError, new_namespace, wait_even_ownership
from bench.operator_scale import (
    apply_list,
    delete_both,
    gone,
    is_ready,
    kubectl_bulk,
    leftover_configurations,
    list_objects,
    memory_kib,
    ready_reason,
    release_leftovers,
)
from bench.workload import delete_everything, object_body, percentiles, s3_client
from devstack import services
from devstack.gateway import ceph_tool, gateway_settings
from devstack.kubectl import Kubectl
from devstack.programs import BIN, Program, ProgramDied, cpu_seconds, free_port, wait_for_port
from devstack.servers.arrivals import Receiver
from devstack.services import REPO, Service

API = "bucketnotify.io/v1alpha1"
EVENT = "s3:ObjectCreated:Put"
DRIFT_INTERVAL_S = 60.0
"""The operator's default (``BUCKETNOTIFY_DRIFT_INTERVAL_SECONDS``), which the run keeps."""
TOPICS_PER_LISTING_PAGE = 100
"""ListTopics answers in pages of 100 topics of the whole tenant (Ceph 18.2 and later)."""

IDLE_WITH_TEN_S = 60.0

GOAL_READY_S = 600.0
GOAL_GONE_S = 600.0
GOAL_OPERATOR_RSS_MIB = 400.0
GOAL_REPLICA_RSS_MIB = 300.0
GOAL_REQUESTS_PER_BUCKET = 1.2
GOAL_APISERVER_PER_S = 5.0
GOAL_IDLE_REPLICA_PERCENT = 5.0
GOAL_LATENCY_RATIO = 1.2

_APISERVER_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_OPERATOR_SAMPLE = re.compile(
    r'^bucketnotify_gateway_requests_total\{operation="(?P<op>[^"]*)"\} (?P<value>\S+)$'
)


@dataclass(frozen=True)
class Options:
    topics: int
    notifications: int
    buckets: int
    replicas: int
    steady: float
    settle: float
    probes: int
    poll: float
    timeout: float
    profile: bool
    out: Path
    handoff: str = "persistent"


# --- the objects ----------------------------------------------------------------------------


def topic_name(i: int) -> str:
    return f"t-{i:05d}"


def scale_topics(count: int, handoff: str = "persistent") -> list[dict[str, Any]]:
    """Even Topics persistent (token Secret, table entry, queue) with ``handoff``, odd ones
    not; nothing listens at their endpoint and nothing is sent to it: their buckets get no
    object."""

    def spec(i: int) -> dict[str, Any]:
        endpoint = {"http": {"url": f"http://127.0.0.1:9/{topic_name(i)}"}}
        if i % 2:
            return {"endpoint": endpoint, "persistent": False}
        return {"endpoint": endpoint, "persistent": True, "delivery": {"handoff": handoff}}

    return [
        {"apiVersion": API, "kind": "Topic", "metadata": {"name": topic_name(i)}, "spec": spec(i)}
        for i in range(count)
    ]


def scale_notifications(count: int, topics: int, buckets: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": API,
            "kind": "BucketNotification",
            "metadata": {"name": f"n-{i:05d}"},
            "spec": {
                "bucket": buckets[i % len(buckets)],
                "topicRef": {"name": topic_name(i % topics)},
                "events": [EVENT],
                "testEvent": False,
            },
        }
        for i in range(count)
    ]


def probe_objects(receiver_url: str, bucket: str) -> list[dict[str, Any]]:
    """The probe Topic (persistent, to the receiver) with its BucketNotification, and nine
    quiet persistent Topics: the system of ten Topics the probe is first timed in."""
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": API,
            "kind": "Topic",
            "metadata": {"name": "probe" if q == 0 else f"quiet-{q}"},
            "spec": {
                "endpoint": {"http": {"url": receiver_url if q == 0 else "http://127.0.0.1:9/"}},
                "persistent": True,
            },
        }
        for q in range(10)
    ]
    objects.append(
        {
            "apiVersion": API,
            "kind": "BucketNotification",
            "metadata": {"name": "probe"},
            "spec": {
                "bucket": bucket,
                "topicRef": {"name": "probe"},
                "events": [EVENT],
                "testEvent": False,
            },
        }
    )
    return objects


# --- what the processes and servers say -----------------------------------------------------


def apiserver_requests(kubectl: Kubectl) -> Counter[str]:
    """The apiserver's requests since it started, all clients, watches excluded, by
    "VERB resource[/subresource]"."""
    counts: Counter[str] = Counter()
    for line in kubectl_bulk(kubectl, "get", "--raw", "/metrics", timeout=60).splitlines():
        match = _APISERVER_SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        if labels.get("verb") == "WATCH":
            continue
        what = labels.get("resource") or "(non-resource)"
        if labels.get("subresource"):
            what += "/" + labels["subresource"]
        counts[f"{labels.get('verb')} {what}"] += int(float(match["value"]))
    return counts


def operator_gateway_requests(metrics_url: str) -> Counter[str]:
    """The operator's ``bucketnotify_gateway_requests_total`` by operation."""
    counts: Counter[str] = Counter()
    with urllib.request.urlopen(metrics_url, timeout=10) as response:  # noqa: S310
        for line in response.read().decode().splitlines():
            match = _OPERATOR_SAMPLE.match(line)
            if match is not None:
                counts[match["op"]] = int(float(match["value"]))
    return counts


class Profiler:
    """py-spy sampling a set of processes into collapsed-stack files, one per process."""

    RATE = 20

    def __init__(self, pids: dict[str, int], directory: Path, part: str) -> None:
        self.files = {name: directory / f"{name}-{part}.collapsed" for name in pids}
        self.procs = [
            subprocess.Popen(
                [
                    str(BIN / "py-spy"),
                    "record",
                    "--pid",
                    str(pid),
                    "--rate",
                    str(self.RATE),
                    "--format",
                    "raw",
                    "--nonblocking",
                    "--output",
                    str(self.files[name]),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for name, pid in pids.items()
        ]

    def stop(self) -> dict[str, dict[str, list[tuple[str, float]]]]:
        for proc in self.procs:
            proc.send_signal(signal.SIGINT)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(60)
        return {name: top_frames(path) for name, path in self.files.items() if path.exists()}


def top_frames(path: Path, count: int = 12) -> dict[str, list[tuple[str, float]]]:
    """The commonest frames of a collapsed-stack file, as percent of all samples: ``own``
    (the frame on top: where the time went) and ``inclusive`` (anywhere on the stack)."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack or not samples.isdigit():
            continue
        n = int(samples)
        total += n
        frames = stack.split(";")
        own[_short(frames[-1])] += n
        for frame in {_short(f) for f in frames}:
            inclusive[frame] += n
    if not total:
        return {"own": [], "inclusive": []}

    def share(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(f, round(100 * n / total, 1)) for f, n in counter.most_common(count)]

    return {"own": share(own), "inclusive": share(inclusive), "samples": [("total", total)]}


def _short(frame: str) -> str:
    # "function (path/to/module.py:line)" -> "function (module.py:line)", repo-relative paths kept.
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    marker = "/bucketnotify/"
    if marker in where:
        where = "bucketnotify/" + where.split(marker, 1)[1]
    elif "site-packages/" in where:
        where = where.split("site-packages/", 1)[1]
    return f"{name} ({where})"


def ours(pids: dict[str, int | None], key: str) -> dict[str, float]:
    """``VmRSS`` or ``VmHWM`` (the peak) of the operator and the replicas, in MiB."""
    return {
        n: round(memory_kib(p).get(key, 0) / 1024, 1)
        for n, p in pids.items()
        if p is not None and (n == "operator" or n.startswith("replica-"))
    }


# --- the measured window --------------------------------------------------------------------


@dataclass
class Window:
    """Resource use of every process, and requests at both servers, over one phase."""

    name: str
    pids: dict[str, int | None]
    kubectl: Kubectl
    gateway: Gateway
    metrics_url: str
    result: dict[str, Any] = field(default_factory=dict)
    bench_lists: int = 0

    def __enter__(self) -> Window:
        self.cpu_before = {n: cpu_seconds(p) for n, p in self.pids.items()}
        self.apiserver_before = apiserver_requests(self.kubectl)
        self.rgw_before = self.gateway.requests()
        self.operator_before = operator_gateway_requests(self.metrics_url)
        self.started = time.monotonic()
        self.result["phase"] = self.name
        return self

    def __exit__(self, *exc: object) -> None:
        elapsed = time.monotonic() - self.started
        cpu_after = {n: cpu_seconds(p) for n, p in self.pids.items()}
        apiserver = apiserver_requests(self.kubectl) - self.apiserver_before
        rgw = self.gateway.requests()
        operator = operator_gateway_requests(self.metrics_url) - self.operator_before
        cpu = {
            n: round(cpu_after[n] - b, 2)  # type: ignore[operator]
            for n, b in self.cpu_before.items()
            if b is not None and cpu_after.get(n) is not None
        }
        # The benchmark's own progress LISTs of both kinds, a fixed cost of watching it.
        own = self.bench_lists
        apiserver_total = sum(apiserver.values()) - own
        self.result.update(
            {
                "window_s": round(elapsed, 1),
                "cpu_s": cpu,
                "cpu_percent_of_a_core": {n: round(100 * v / elapsed, 1) for n, v in cpu.items()},
                "apiserver_requests": apiserver_total,
                "apiserver_requests_per_s": round(apiserver_total / elapsed, 2),
                "apiserver_by_request": dict(apiserver.most_common(12)),
                "bench_progress_lists": own,
                "gateway_requests": (
                    rgw - self.rgw_before if rgw is not None and self.rgw_before else None
                ),
                "operator_gateway_requests": dict(operator.most_common()),
                "rss_mib": ours(self.pids, "VmRSS"),
                "rss_peak_mib": ours(self.pids, "VmHWM"),
                "load_average_1m": round(os.getloadavg()[0], 2),
            }
        )


def wait_done(
    window: Window,
    kubectl: Kubectl,
    namespace: str,
    expected: dict[str, set[str]],
    done: Callable[[dict[str, Any]], bool],
    options: Options,
    alive: Callable[[], None],
) -> None:
    """Poll with one LIST per kind every ``options.poll`` seconds until ``done`` holds for
    every expected object; when each was first seen done goes in the window's result."""
    first: dict[tuple[str, str], float] = {}
    total = sum(len(n) for n in expected.values())
    reasons: Counter[str] = Counter()
    while True:
        reasons = Counter()
        for kind, names in expected.items():
            items = {o["metadata"]["name"]: o for o in list_objects(kubectl, namespace, kind)}
            window.bench_lists += 1
            now = time.monotonic() - window.started
            for name in names:
                if (kind, name) in first:
                    continue
                obj = items.get(name, {})
                if done(obj):
                    first[kind, name] = now
                else:
                    reasons[ready_reason(obj)[1] if obj else "Missing"] += 1
        if len(first) == total:
            break
        alive()
        if time.monotonic() - window.started > options.timeout:
            raise SetupError(
                f"{window.name}: {total - len(first)} objects not done after "
                f"{options.timeout:.0f} s: {dict(reasons.most_common(5))}"
            )
        time.sleep(options.poll)
    times = sorted(first.values())

    def rank(q: float) -> float:
        return round(times[max(0, math.ceil(q * len(times)) - 1)], 1)

    window.result.update(
        {
            "objects": total,
            "seconds": rank(1.0),
            "objects_per_s": round(total / rank(1.0), 1) if rank(1.0) else None,
            "done_at_s": {"p50": rank(0.5), "p90": rank(0.9), "max": rank(1.0)},
        }
    )


def probe_latencies(
    s3: Any, bucket: str, receiver: Receiver, count: int, label: str
) -> dict[str, Any]:
    """``count`` events on the probe Topic, one at a time on a quiet system: PUT start to
    arrival at the endpoint."""
    latencies: list[float] = []
    missing = 0
    for n in range(count):
        key = f"{label}-{n}"
        put_at = time.time()
        s3.put_object(Bucket=bucket, Key=key, Body=object_body(key, 100))
        deadline = time.monotonic() + 30
        arrived = None
        while arrived is None and time.monotonic() < deadline:
            arrived = next((a.at for a in receiver.fetch() if a.key == key), None)
            if arrived is None:
                time.sleep(0.005)
        if arrived is None:
            missing += 1
        else:
            latencies.append(arrived - put_at)
        time.sleep(0.5)
    return {"ms": percentiles(latencies), "missing": missing}


# --- the run --------------------------------------------------------------------------------


@contextlib.contextmanager
def buckets_of_the_run(rgw: Service, s3: Any, names: list[str]) -> Iterator[list[str]]:
    # A gateway user may own 1,000 buckets by default, and the shared test user has some.
    subprocess.run(
        ceph_tool(
            rgw,
            "radosgw-admin",
            "user",
            "modify",
            f"--uid={rgw['RGW_USER']}",
            f"--max-buckets={len(names) + 5000}",
        ),
        capture_output=True,
        timeout=120,
        check=True,
    )
    try:
        for name in names:
            s3.create_bucket(Bucket=name)
        yield names
    finally:
        for name in names:
            _best_effort(f"deleting bucket {name}", lambda n=name: delete_everything([s3], n))


def start_system(
    options: Options,
    kube: Service,
    rgw: Service,
    namespace: str,
    store_bucket: str,
    log_dir: Path,
    stack: contextlib.ExitStack,
) -> tuple[Program, list[Program], str]:
    """The replicas behind a proxy and the operator pointed at it; the operator's metrics
    URL. Stopped by ``stack``."""
    gateway_env = gateway_settings(rgw)
    replicas, proxy = start_replicas(
        options.replicas, kube, gateway_env, namespace, store_bucket, log_dir, stack
    )
    metrics_port = free_port()
    operator = Program(
        ["operator"],
        {
            "KUBECONFIG": kube["KUBECONFIG_ADMIN"],
            **gateway_env,
            "BUCKETNOTIFY_NAMESPACES": json.dumps([namespace]),
            "BUCKETNOTIFY_LEADER_ELECTION_NAMESPACE": namespace,
            "BUCKETNOTIFY_DELIVERY_NAMESPACE": namespace,
            "BUCKETNOTIFY_INGEST_URL": proxy.url,
            "BUCKETNOTIFY_METRICS_PORT": str(metrics_port),
        },
        name="operator",
        log_dir=log_dir,
    )
    stack.callback(operator.stop)
    wait_for_port(metrics_port, 60, operator)
    return operator, replicas, f"http://127.0.0.1:{metrics_port}/metrics"


def measure(options: Options, rgw: Service, kube: Service, out: Path, stamp: str) -> dict[str, Any]:
    kubectl = Kubectl.admin(kube)
    kubectl.install_crds()
    gateway = Gateway(rgw)
    s3 = s3_client(rgw)
    namespace = new_namespace(kubectl, "bench-scale")
    tag = namespace.rsplit("-", 1)[-1]
    marks = [namespace]
    log_dir = out / f"scale-{stamp}-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {"namespace": namespace, "logs": str(log_dir), "phases": []}
    print(f"namespace {namespace}; logs in {log_dir}", flush=True)
    document["gateway_topics_before"] = len(gateway.topic_names(""))
    bucket_names = [f"bns-{tag}-{b}" for b in range(options.buckets)]
    probe_bucket = f"bns-{tag}-probe"
    store_bucket = f"bns-{tag}-queues"
    topic_objects = scale_topics(options.topics, options.handoff)
    notification_objects = scale_notifications(options.notifications, options.topics, bucket_names)
    all_topics = (
        {o["metadata"]["name"] for o in topic_objects}
        | {"probe"}
        | {f"quiet-{q}" for q in range(1, 10)}
    )
    all_notifications = {o["metadata"]["name"] for o in notification_objects} | {"probe"}

    with contextlib.ExitStack() as stack:
        receiver = stack.enter_context(Receiver())
        stack.callback(
            _best_effort, f"deleting {store_bucket}", lambda: delete_everything([s3], store_bucket)
        )
        print(f"== creating {options.buckets + 1} buckets", flush=True)
        stack.enter_context(buckets_of_the_run(rgw, s3, [*bucket_names, probe_bucket]))
        operator, replicas, metrics_url = start_system(
            options, kube, rgw, namespace, store_bucket, log_dir, stack
        )
        pids: dict[str, int | None] = {
            "operator": operator.pid,
            **{r.name: r.pid for r in replicas},
            "kube-apiserver": services.pid_of("kube", "apiserver.pid"),
            "etcd": services.pid_of("kube", "etcd.pid"),
            "radosgw": services.pid_of("ceph", "rgw.pid"),
            "ceph-osd": services.pid_of("ceph", "osd.pid"),
        }
        processes = [operator, *replicas]

        def alive() -> None:
            for program in processes:
                program.check_alive()

        def window(name: str) -> Window:
            return Window(name, pids, kubectl, gateway, metrics_url)

        profiler: Profiler | None = None
        cleaned = False
        try:
            print("== ten Topics: the probe and nine quiet ones", flush=True)
            apply_list(kubectl, namespace, probe_objects(receiver.url, probe_bucket))
            with window("ten topics") as w:
                wait_done(
                    w,
                    kubectl,
                    namespace,
                    {"Topic": {"probe"} | {f"quiet-{q}" for q in range(1, 10)}},
                    is_ready,
                    options,
                    alive,
                )
                wait_done(
                    w,
                    kubectl,
                    namespace,
                    {"BucketNotification": {"probe"}},
                    is_ready,
                    options,
                    alive,
                )
            identities = [r.name for r in replicas]
            wait_even_ownership(kubectl, namespace, identities, PARTITIONS, 180, stable_s=10)
            time.sleep(options.settle)
            document["probe_with_ten"] = probe_latencies(
                s3, probe_bucket, receiver, options.probes, "ten"
            )
            print(f"  probe with ten Topics: {document['probe_with_ten']}", flush=True)
            # What every process spends with ten Topics and nothing happening: the floor
            # the steady state at full size is read against.
            with window("idle with ten") as w:
                time.sleep(IDLE_WITH_TEN_S)
            document["idle_with_ten"] = w.result
            print(_phase_line(w.result), flush=True)
            document["rss_idle_mib"] = ours(pids, "VmRSS")

            profiled = {p.name: p.pid for p in processes}
            if options.profile:
                profiler = Profiler(profiled, log_dir, "create")
            for name, kind, objects, names in (
                ("create topics", "Topic", topic_objects, all_topics),
                (
                    "create notifications",
                    "BucketNotification",
                    notification_objects,
                    all_notifications,
                ),
            ):
                print(f"== {name}: {len(objects)}", flush=True)
                w = window(name)
                document["phases"].append(w.result)
                with w:
                    apply_list(kubectl, namespace, objects)
                    w.result["apply_s"] = round(time.monotonic() - w.started, 1)
                    print(f"  applied in {w.result['apply_s']} s; waiting", flush=True)
                    wait_done(w, kubectl, namespace, {kind: names}, is_ready, options, alive)
                print(_phase_line(w.result), flush=True)

            print(
                f"== settling {options.settle:.0f} s, then steady state {options.steady:.0f} s",
                flush=True,
            )
            # What grows with the objects shows apart from what creating them cost.
            if profiler is not None:
                document["profile"] = profiler.stop()
                profiler = None
            time.sleep(options.settle)
            if options.profile:
                profiler = Profiler(profiled, log_dir, "steady")
            w = window("steady state")
            with w:
                time.sleep(options.steady)
                alive()
            document["steady"] = w.result
            print(_phase_line(w.result), flush=True)
            if profiler is not None:
                document["profile_steady"] = profiler.stop()
                profiler = None
            document["probe_with_all"] = probe_latencies(
                s3, probe_bucket, receiver, options.probes, "all"
            )
            print(f"  probe with all Topics: {document['probe_with_all']}", flush=True)
            document["gateway_topics_of_the_run"] = len(gateway.topic_names(*marks))

            print("== delete both kinds", flush=True)
            w = window("delete both")
            document["phases"].append(w.result)
            with w:
                delete_both(kubectl, namespace)
                wait_done(
                    w,
                    kubectl,
                    namespace,
                    {"BucketNotification": all_notifications, "Topic": all_topics},
                    gone,
                    options,
                    alive,
                )
            print(_phase_line(w.result), flush=True)
            cleaned = True
        except (SetupError, ProgramDied, subprocess.TimeoutExpired, KeyboardInterrupt) as exc:
            # Interrupted too: what was measured so far is still written and reported.
            traceback.print_exc()
            document["error"] = f"{type(exc).__name__}: {exc}"
            print(f"--- operator log ({operator.log_path}) ends:\n{operator.tail(30)}")
        finally:
            if profiler is not None:
                document.setdefault("profile", profiler.stop())
            if not cleaned:
                with contextlib.suppress(Exception):
                    delete_both(kubectl, namespace)
                    time.sleep(120)
                operator.stop()
                document["released_after_failure"] = len(
                    release_leftovers(kubectl, namespace, rgw, marks)
                )
            document["leftover_gateway_topics"] = gateway.topic_names(*marks)
            document["leftover_bucket_configurations"] = leftover_configurations(
                rgw, [*bucket_names, probe_bucket]
            )
            if document["leftover_gateway_topics"]:
                gateway.remove(document["leftover_gateway_topics"])
    document["gateway_topics_after"] = len(gateway.topic_names(""))
    return document


# --- report ---------------------------------------------------------------------------------


def _phase_line(r: dict[str, Any]) -> str:
    return (
        f"  {r['phase']}: {r.get('objects', '-')} objects in {r.get('seconds', r['window_s'])} s;"
        f" CPU s {r['cpu_s']}; RSS peak {r['rss_peak_mib']} MiB; apiserver"
        f" {r['apiserver_requests']} requests; gateway {r['gateway_requests']} requests,"
        f" the operator's {r['operator_gateway_requests']}; apiserver by request"
        f" {dict(list(r['apiserver_by_request'].items())[:6])}"
    )


def _verdict(value: float | None, goal: float) -> str:
    if value is None:
        return "not measured"
    return "met" if value <= goal else "NOT met"


def report(document: dict[str, Any], options: Options) -> str:
    lines = [
        f"scale benchmark: {options.topics} Topics (half persistent, handoff"
        f" {options.handoff}) + {options.notifications}"
        f" BucketNotifications on {options.buckets} buckets, operator + {options.replicas}"
        " delivery replicas",
    ]
    phases = {r["phase"]: r for r in document["phases"] if "seconds" in r}
    per_object_header = (
        f"{'phase':<22}{'objects':>8}{'s':>7}{'obj/s':>7}"
        f"{'CPU ms/object: operator':>25}{'replicas':>9}{'apisrv':>7}{'etcd':>6}{'rgw':>6}"
        f"{'apisrv req/obj':>15}{'rgw req/obj':>12}"
    )
    lines += [per_object_header, "-" * len(per_object_header)]
    for name, r in phases.items():
        cpu, n = r["cpu_s"], r["objects"]
        replicas = sum(v for k, v in cpu.items() if k.startswith("replica-"))

        def ms(value: float | None, n: int = n) -> str:
            return "-" if value is None else f"{1000 * value / n:.1f}"

        lines.append(
            f"{name:<22}{n:>8}{r['seconds']:>7.0f}{r['objects_per_s'] or 0:>7.1f}"
            f"{ms(cpu.get('operator')):>25}{ms(replicas):>9}{ms(cpu.get('kube-apiserver')):>7}"
            f"{ms(cpu.get('etcd')):>6}{ms(cpu.get('radosgw')):>6}"
            f"{r['apiserver_requests'] / n:>15.2f}"
            f"{(r['gateway_requests'] or 0) / n:>12.2f}"
        )
    created = [phases.get("create topics"), phases.get("create notifications")]
    if all(created):
        ready_s = sum(p["seconds"] for p in created if p)
        lines.append(
            f"all Ready: {ready_s:.0f} s after the first apply (goal <= {GOAL_READY_S:.0f} s:"
            f" {_verdict(ready_s, GOAL_READY_S)})"
        )
    deleted = phases.get("delete both")
    if deleted:
        lines.append(
            f"all gone: {deleted['seconds']:.0f} s after the delete (goal <= {GOAL_GONE_S:.0f} s:"
            f" {_verdict(deleted['seconds'], GOAL_GONE_S)})"
        )
    peaks: dict[str, float] = {}
    for r in document["phases"]:
        for n, v in (r.get("rss_peak_mib") or {}).items():
            peaks[n] = max(peaks.get(n, 0.0), v)
    for n, v in (document.get("steady") or {}).get("rss_peak_mib", {}).items():
        peaks[n] = max(peaks.get(n, 0.0), v)
    for n, v in sorted(peaks.items()):
        goal = GOAL_OPERATOR_RSS_MIB if n == "operator" else GOAL_REPLICA_RSS_MIB
        lines.append(
            f"peak RSS {n}: {v:.0f} MiB (idle before {document.get('rss_idle_mib', {}).get(n)} MiB;"
            f" goal <= {goal:.0f}: {_verdict(v, goal)})"
        )
    steady = document.get("steady")
    if steady:
        seconds = steady["window_s"]
        intervals = seconds / DRIFT_INTERVAL_S
        per_s = steady["apiserver_requests_per_s"]
        leases = sum(
            n for what, n in steady["apiserver_by_request"].items() if what.endswith(" leases")
        )
        ops = steady["operator_gateway_requests"]
        listings = ops.get("ListTopics", 0) / intervals
        others = (sum(ops.values()) - ops.get("ListTopics", 0)) / intervals
        used = max(1, min(options.buckets, options.notifications))
        pages = math.ceil(
            (document.get("gateway_topics_of_the_run") or 0) / TOPICS_PER_LISTING_PAGE
        )
        lines += [
            f"steady state, {seconds:.0f} s ({intervals:.1f} drift intervals"
            f" of {DRIFT_INTERVAL_S:.0f} s):",
            f"  operator's gateway requests per drift interval: {others:.0f} besides ListTopics for"
            f" {used} buckets = {others / used:.2f} per bucket (goal <= {GOAL_REQUESTS_PER_BUCKET}:"
            f" {_verdict(others / used, GOAL_REQUESTS_PER_BUCKET)}), and {listings:.0f} ListTopics"
            f" pages ({pages} pages hold the run's gateway topics); by operation {ops}",
            f"  gateway requests from every client:"
            f" {(steady['gateway_requests'] or 0) / seconds:.1f}/s",
            f"  apiserver requests, watches excluded: {per_s}/s"
            f" (goal < {GOAL_APISERVER_PER_S}: {_verdict(per_s, GOAL_APISERVER_PER_S - 1e-9)});"
            f" most: {steady['apiserver_by_request']}",
            f"  of which Leases (queue ownership and the leader: (partitions + replicas) per"
            f" renew interval, whatever the objects): {leases / seconds:.2f}/s; the rest"
            f" {per_s - leases / seconds:.2f}/s",
            f"  share of a core, %: {steady['cpu_percent_of_a_core']}",
            "  the same with ten Topics, idle:"
            f" {(document.get('idle_with_ten') or {}).get('cpu_percent_of_a_core')};"
            " apiserver requests/s"
            f" {(document.get('idle_with_ten') or {}).get('apiserver_requests_per_s')}",
        ]
        worst = max(
            (v for n, v in steady["cpu_percent_of_a_core"].items() if n.startswith("replica-")),
            default=None,
        )
        lines.append(
            f"  idle replica, worst: {worst} % of a core (goal < {GOAL_IDLE_REPLICA_PERCENT}:"
            f" {_verdict(worst, GOAL_IDLE_REPLICA_PERCENT - 1e-9)})"
        )
    ten, everything = document.get("probe_with_ten"), document.get("probe_with_all")
    if ten and everything and ten["ms"]["p50"] and everything["ms"]["p50"]:
        ratio = everything["ms"]["p50"] / ten["ms"]["p50"]
        lines.append(
            f"event latency on one Topic, p50/p90 ms: {ten['ms']['p50']:.0f}/{ten['ms']['p90']:.0f}"
            f" with 10 Topics, {everything['ms']['p50']:.0f}/{everything['ms']['p90']:.0f}"
            f" with all; p50 ratio {ratio:.2f} (goal <= {GOAL_LATENCY_RATIO}:"
            f" {_verdict(ratio, GOAL_LATENCY_RATIO)});"
            f" missing {ten['missing']} + {everything['missing']}"
        )
    profiles = [("creating", document.get("profile")), ("steady", document.get("profile_steady"))]
    for part, profile in profiles:
        for name, frames in (profile or {}).items():
            lines.append(f"top frames, {name}, {part} ({frames.get('samples')} samples):")
            lines += [f"    own {share:5.1f} %  {frame}" for frame, share in frames["own"][:8]]
            lines += [
                f"    incl {share:5.1f} % {frame}" for frame, share in frames["inclusive"][:12]
            ]
    left = document.get("leftover_gateway_topics") or []
    lines.append(
        f"left on the gateway: {len(left)} topics of the run, bucket configurations"
        f" {document.get('leftover_bucket_configurations')} (goal: none); gateway topics, all"
        f" users: {document.get('gateway_topics_before')} before,"
        f" {document.get('gateway_topics_after')} after"
    )
    return "\n".join(lines)


# --- entry point ----------------------------------------------------------------------------


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--topics", type=int, default=10000, help="Topics, the even ones persistent"
    )
    parser.add_argument("--notifications", type=int, default=10000)
    parser.add_argument("--buckets", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=2, help="delivery replicas")
    parser.add_argument("--steady", type=float, default=600.0, help="seconds of steady state")
    parser.add_argument(
        "--settle", type=float, default=90.0, help="quiet seconds before the steady state"
    )
    parser.add_argument("--probes", type=int, default=20, help="events timed on the probe Topic")
    parser.add_argument(
        "--poll", type=float, default=5.0, help="seconds between the progress LISTs"
    )
    parser.add_argument("--timeout", type=float, default=2400.0, help="seconds a phase may take")
    parser.add_argument("--profile", action="store_true", help="sample our processes with py-spy")
    parser.add_argument(
        "--handoff",
        choices=("persistent", "sync"),
        default="persistent",
        help="the persistent Topics' spec.delivery.handoff (sync: no gateway queue each)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    if min(args.topics, args.buckets, args.replicas, args.probes) < 1 or args.notifications < 0:
        parser.error("--topics, --buckets, --replicas and --probes must be at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    options = Options(
        topics=args.topics,
        notifications=args.notifications,
        buckets=args.buckets,
        replicas=args.replicas,
        steady=args.steady,
        settle=args.settle,
        probes=args.probes,
        poll=args.poll,
        timeout=args.timeout,
        profile=args.profile,
        out=args.out,
        handoff=args.handoff,
    )
    return options


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    out = options.out
    signal.signal(signal.SIGTERM, _interrupt)
    stamp = time.strftime("%Y%m%d-%H%M%S")

    def benchmark(started: list[Service]) -> int:
        rgw = services.start("ceph")
        started.append(rgw)
        kube = services.start("kube")
        started.append(kube)
        load_before = os.getloadavg()
        measured = measure(options, rgw, kube, out, stamp)
        document = {
            "benchmark": "scale",
            "started": stamp,
            "host": {
                "cpus": os.cpu_count(),
                "load_average_before": load_before,
                "load_average_after": os.getloadavg(),
                "python": platform.python_version(),
                "gateway": services.ceph_release(),
            },
            "source": source_revision(),
            "options": asdict(options),
            **measured,
        }
        path = out / f"scale-{stamp}.json"
        path.write_text(json.dumps(document, indent=2, default=str) + "\n")
        print()
        if "error" in measured:
            print(f"FAILED: {measured['error']}")
        print(report(document, options))
        print(f"results: {path}")
        return 1 if "error" in measured else 0

    return guarded("bench.scale", benchmark, (SetupError,))


if __name__ == "__main__":
    sys.exit(main())
