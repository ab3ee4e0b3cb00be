"""Delivery benchmark: the gateway's own push against bucketnotify, same workload, one run.

``python -m bench.delivery [--events N] [--scenarios a,b]`` (``make bench``). Each scenario
creates its own bucket, notification and HTTP endpoint, warms the path up with one event,
then has 8 concurrent clients (``--clients``) PUT N objects (``--events``) of 100 bytes
(``s3:ObjectCreated:Put`` only)
and waits until every event reached the endpoint, or until none arrived for
``--idle-timeout`` seconds (the rest are reported missing), then listens ``--settle``
seconds more for late duplicates.

Figures per scenario: throughput (events / first PUT start to last first arrival),
end-to-end latency percentiles (PUT start to endpoint receipt of the first copy),
duplicate deliveries, missing events, PUT rate and PUT latency (hand-off ``sync`` makes the
PUT wait for our commit), and CPU seconds of the processes involved. A scenario that lost
events (a PUT that failed or was never answered, an event that never arrived) has its
events/s marked ``*`` and a line below the table saying what was lost: a PUT the gateway
left unanswered until the client's 60 s read timeout is in the span, so in events/s. The
JSON file keeps everything; stdout gets a table and the ratios against the gateway
scenarios of the same run (none if the run has none), and CPU milliseconds per delivered
event (ours, and the gateway's and OSD's work beyond gateway-sync's). ``--ramp
1,8,32,64`` runs the scenarios at each client count instead and prints throughput and p99
per step, so the knee of each curve shows. Our processes' logs (and with
``--profile`` their cProfile files) are kept beside the JSON file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from prometheus_client.parser import text_string_to_metric_families

from bench.gateway import Gateway
from bench.guarded import guarded
from bench.kube import (
    Kubectl,
    SetupError,
    apply,
    new_namespace,
    wait_even_ownership,
    wait_lease_held,
    wait_ready,
)
from bench.relay import Relay
from bench.workload import (
    WARMUP_PREFIX,
    Collector,
    PutWorkload,
    delete_everything,
    object_body,
    percentiles,
    s3_client,
)
from bucketnotify.delivery.peers.ownership import LeaseSettings
from bucketnotify.delivery.rounds.shard_loops import HANDOVER_POLL_ROUNDS
from devstack import services
from devstack.gateway import gateway_settings
from devstack.programs import Program, cpu_seconds, free_port, wait_for_port
from devstack.servers.arrivals import Receiver
from devstack.servers.tcpproxy import Balancer
from devstack.services import REPO, Service

EVENT = "s3:ObjectCreated:Put"
PARTITIONS = 32
OPERATOR_LEASE = "bucketnotify-operator"


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    stack: Literal["gateway", "relay", "bucketnotify"]
    persistent: bool
    """gateway: the gateway topic's ``persistent``; bucketnotify: hand-off ``persistent``."""
    store: Literal["dir", "s3"] = "dir"
    replicas: int = 1


def scenarios(s3_replicas: int) -> dict[str, Scenario]:
    listed = [
        Scenario(
            "gateway-sync", "gateway pushes to the endpoint, non-persistent", "gateway", False
        ),
        Scenario("gateway-persistent", "gateway's own persistent queue", "gateway", True),
        Scenario(
            "relay-sync",
            "gateway pushes through a relay that only forwards (the floor of one hop)",
            "relay",
            False,
        ),
        Scenario(
            "bucketnotify-sync", "hand-off sync, local-dir store, 1 replica", "bucketnotify", False
        ),
        Scenario(
            "bucketnotify-persistent",
            "hand-off persistent, local-dir store, 1 replica",
            "bucketnotify",
            True,
        ),
        Scenario(
            "bucketnotify-sync-s3",
            f"hand-off sync, S3 store on the gateway, {s3_replicas} replica(s)"
            + (" behind a round-robin proxy" if s3_replicas > 1 else ""),
            "bucketnotify",
            False,
            store="s3",
            replicas=s3_replicas,
        ),
    ]
    return {s.name: s for s in listed}


@dataclass(frozen=True)
class Options:
    events: int
    clients: int
    size: int
    idle_timeout: float
    settle: float
    setup_timeout: float
    shards: int | None
    profile: bool
    endpoint_delay_s: float = 0.0


class Run:
    """What every scenario of one run shares: services, clients, ids, where logs go."""

    def __init__(
        self,
        options: Options,
        rgw: Service,
        kube: Service | None,
        out: Path,
        benchmark: str = "delivery",
    ) -> None:
        self.options = options
        self.rgw = rgw
        self.kube = kube
        self.id = time.strftime("%Y%m%d-%H%M%S")
        self.tag = uuid.uuid4().hex[:6]
        self.log_dir = out / f"{benchmark}-{self.id}-logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.clients = [s3_client(rgw) for _ in range(options.clients)]
        self.kubectl = Kubectl.admin(kube) if kube else None

    def bucket_name(self, scenario: Scenario) -> str:
        return f"bnb-{self.tag}-{scenario.name}"[:63]


# --- scenario set-up ------------------------------------------------------------------------


@contextlib.contextmanager
def bucket(run: Run, name: str) -> Iterator[str]:
    run.clients[0].create_bucket(Bucket=name)
    try:
        yield name
    finally:
        _best_effort(f"deleting bucket {name}", lambda: delete_everything(run.clients, name))


@contextlib.contextmanager
def gateway_topic(run: Run, name: str, endpoint: str, persistent: bool) -> Iterator[str]:
    sns = s3_client(run.rgw, "sns")
    attributes = {"push-endpoint": endpoint, "persistent": "true" if persistent else "false"}
    arn: str = sns.create_topic(Name=name, Attributes=attributes)["TopicArn"]
    try:
        yield arn
    finally:
        _best_effort(f"deleting topic {name}", lambda: sns.delete_topic(TopicArn=arn))


def notify(run: Run, bucket_name: str, arn: str) -> None:
    run.clients[0].put_bucket_notification_configuration(
        Bucket=bucket_name,
        NotificationConfiguration={
            "TopicConfigurations": [{"Id": "bench", "TopicArn": arn, "Events": [EVENT]}]
        },
    )


@dataclass
class Stack:
    """Our processes in one scenario; the measurement polls them for an early exit."""

    programs: list[Program] = field(default_factory=list)
    proxy: Balancer | None = None
    relay: Relay | None = None
    ports: list[int] = field(default_factory=list)
    """The replicas' ingest ports, where their metrics are served."""
    namespace: str | None = None
    """Where our Topic, Leases and operator live (bucketnotify scenarios)."""

    def check_alive(self) -> None:
        for program in self.programs:
            program.check_alive()


def setup_gateway(
    run: Run, scenario: Scenario, stack: contextlib.ExitStack, receiver: Receiver, ours: Stack
) -> None:
    name = run.bucket_name(scenario)
    # Topic first and gone last: the bucket's objects are deleted while it still exists.
    arn = stack.enter_context(gateway_topic(run, name, receiver.url, scenario.persistent))
    stack.enter_context(bucket(run, name))
    notify(run, name, arn)


def setup_relay(
    run: Run, scenario: Scenario, stack: contextlib.ExitStack, receiver: Receiver, ours: Stack
) -> None:
    ours.relay = stack.enter_context(Relay(receiver.url))
    name = run.bucket_name(scenario)
    arn = stack.enter_context(gateway_topic(run, name, ours.relay.url, scenario.persistent))
    stack.enter_context(bucket(run, name))
    notify(run, name, arn)


def setup_bucketnotify(
    run: Run, scenario: Scenario, stack: contextlib.ExitStack, receiver: Receiver, ours: Stack
) -> None:
    assert run.kube is not None and run.kubectl is not None
    kubectl = run.kubectl
    namespace = new_namespace(kubectl, f"bench-{scenario.name}"[:50])
    ours.namespace = namespace
    print(f"  namespace {namespace}", flush=True)
    gateway_env = gateway_settings(run.rgw)
    log_dir = run.log_dir / scenario.name
    log_dir.mkdir(exist_ok=True)

    if scenario.store == "s3":
        store_bucket = f"bnb-{run.tag}-queues-{scenario.name}"[:63]
        store = f"s3://{store_bucket}"
        # Registered before the replicas start, so it runs after they stopped.
        stack.callback(
            _best_effort,
            f"deleting queue bucket {store_bucket}",
            lambda: delete_everything(run.clients, store_bucket),
        )
    else:
        store = f"dir://{log_dir / 'queues'}"

    identities = [f"replica-{i + 1}" for i in range(scenario.replicas)]
    ports: list[int] = []
    for identity in identities:
        port = free_port()
        replica = Program(
            ["delivery"],
            {
                "KUBECONFIG": run.kube["KUBECONFIG_ADMIN"],
                "BUCKETNOTIFY_DELIVERY_STORE": store,
                "BUCKETNOTIFY_DELIVERY_LISTEN_PORT": str(port),
                "BUCKETNOTIFY_DELIVERY_LEASE_NAMESPACE": namespace,
                "BUCKETNOTIFY_DELIVERY_NAMESPACES": json.dumps([namespace]),
                "BUCKETNOTIFY_DELIVERY_IDENTITY": identity,
                "BUCKETNOTIFY_DELIVERY_PARTITIONS": str(PARTITIONS),
                **(gateway_env if scenario.store == "s3" else {}),
            },
            name=identity,
            log_dir=log_dir,
            profile=run.options.profile,
        )
        stack.callback(replica.stop)
        ours.programs.append(replica)
        ports.append(port)
    for replica, port in zip(ours.programs, ports, strict=True):
        wait_for_port(port, 60, replica)
    ours.ports = ports

    ingest_url = f"http://127.0.0.1:{ports[0]}"
    if len(ports) > 1:
        ours.proxy = stack.enter_context(Balancer(ports))
        ingest_url = ours.proxy.url

    operator = Program(
        ["operator"],
        {
            "KUBECONFIG": run.kube["KUBECONFIG_ADMIN"],
            **gateway_env,
            "BUCKETNOTIFY_NAMESPACES": json.dumps([namespace]),
            "BUCKETNOTIFY_LEADER_ELECTION_NAMESPACE": namespace,
            "BUCKETNOTIFY_INGEST_URL": ingest_url,
            # Not the default 9090: another operator on this machine may hold it.
            "BUCKETNOTIFY_METRICS_PORT": str(free_port()),
        },
        name="operator",
        log_dir=log_dir,
        profile=run.options.profile,
    )
    stack.callback(operator.stop)
    ours.programs.append(operator)
    # A replica that lists a Topic before the operator made its ingest token Secret answers
    # 404 for it until its next look. Applying the Topic once the operator leads keeps that
    # window to the operator's reaction time: set-up, not the warm-up, pays for it.
    if not wait_lease_held(kubectl, namespace, OPERATOR_LEASE, run.options.setup_timeout):
        operator.check_alive()
        print(f"  warning: the operator took no Lease {OPERATOR_LEASE} yet", flush=True)

    bucket_name = stack.enter_context(bucket(run, run.bucket_name(scenario)))
    delivery: dict[str, Any] = {"handoff": "persistent" if scenario.persistent else "sync"}
    if run.options.shards is not None:
        delivery["shards"] = run.options.shards
    # Deleted (the operator's finalizers clean the gateway) before the bucket and the
    # processes go.
    stack.callback(_delete_resources, kubectl, namespace)
    apply(
        kubectl,
        namespace,
        "Topic",
        "bench",
        {"endpoint": {"http": {"url": receiver.url}}, "persistent": True, "delivery": delivery},
    )
    wait_ready(kubectl, namespace, "topic", "bench", run.options.setup_timeout)
    apply(
        kubectl,
        namespace,
        "BucketNotification",
        "bench",
        {
            "bucket": bucket_name,
            "topicRef": {"name": "bench"},
            "testEvent": False,
            "events": [EVENT],
        },
    )
    wait_ready(kubectl, namespace, "bucketnotification", "bench", run.options.setup_timeout)
    wait_even_ownership(
        kubectl,
        namespace,
        identities,
        PARTITIONS,
        run.options.setup_timeout,
        stable_s=HANDOVER_POLL_ROUNDS * LeaseSettings.renew_interval_s,
    )


def _delete_resources(kubectl: Kubectl, namespace: str) -> None:
    for kind in ("bucketnotification", "topic"):
        result = kubectl.run(
            "delete", kind, "bench", "-n", namespace, "--wait", "--timeout=60s", check=False
        )
        if result.returncode != 0:
            print(f"  warning: deleting {kind} {namespace}/bench: {result.stderr.strip()}")


def _best_effort(what: str, action: Any) -> None:
    # Clean-up must not hide the result (or the error) of the scenario itself.
    try:
        action()
    except Exception as exc:
        print(f"  warning: {what} failed: {exc}", flush=True)


# --- one measurement ------------------------------------------------------------------------


def warm_up(run: Run, bucket_name: str, receiver: Receiver, stack: Stack) -> float:
    """PUT a warm-up object until one reaches the endpoint; seconds it took.

    The first events after a notification is created take a while (the gateway, and our
    replica, look the topic up first); that is set-up, not delivery.
    """
    start = time.monotonic()
    deadline = start + run.options.setup_timeout
    attempt = 0
    while time.monotonic() < deadline:
        key = f"{WARMUP_PREFIX}{attempt}"
        run.clients[0].put_object(
            Bucket=bucket_name, Key=key, Body=object_body(key, run.options.size)
        )
        attempt += 1
        until = time.monotonic() + 3
        while time.monotonic() < until:
            if any(a.key.startswith(WARMUP_PREFIX) for a in receiver.fetch()):
                return time.monotonic() - start
            stack.check_alive()
            time.sleep(0.05)
    raise SetupError(
        f"no warm-up event reached the endpoint within {run.options.setup_timeout:.0f} s"
    )


def _cpu_pids(receiver: Receiver, stack: Stack) -> dict[str, int | None]:
    pids: dict[str, int | None] = {
        "radosgw": services.pid_of("ceph", "rgw.pid"),
        "ceph-osd": services.pid_of("ceph", "osd.pid"),
        "kube-apiserver": services.pid_of("kube", "apiserver.pid"),
        "etcd": services.pid_of("kube", "etcd.pid"),
        "receiver": receiver.pid,
    }
    for program in stack.programs:
        pids[program.name] = program.pid
    if stack.proxy is not None:
        pids["proxy"] = stack.proxy.pid
    if stack.relay is not None:
        pids["relay"] = stack.relay.pid
    return pids


def measure(run: Run, bucket_name: str, receiver: Receiver, stack: Stack) -> dict[str, Any]:
    options = run.options
    warmup_s = warm_up(run, bucket_name, receiver, stack)
    # Stragglers of the warm-up (the gateway re-sends) must not land in this run's figures:
    # they carry the warm-up prefix and are counted apart.
    keys = [f"obj-{i:06d}" for i in range(options.events)]
    wanted = set(keys)
    collector = Collector(receiver)
    pids = _cpu_pids(receiver, stack)
    gateway = Gateway(run.rgw)
    requests_before = gateway.requests()
    cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    direct_before = _direct_counts(stack)
    own_cpu_before = time.process_time()

    workload = PutWorkload(run.clients, bucket_name, keys, options.size)
    print(f"  putting {options.events} objects with {options.clients} clients ...", flush=True)
    workload.start()
    last_progress = time.monotonic()
    try:
        while True:
            if collector.poll(wanted.__contains__) or workload.running():
                last_progress = time.monotonic()
            else:
                arrived = all(k in collector.first for k in workload.log.finished)
                if arrived or time.monotonic() - last_progress > options.idle_timeout:
                    break
            stack.check_alive()
            time.sleep(0.1)
    finally:
        workload.stop()
    cpu_after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    own_cpu = time.process_time() - own_cpu_before
    direct_after = _direct_counts(stack)
    requests_after = gateway.requests()
    # This machine may be shared: a high load here means other work skewed the figures.
    load = os.getloadavg()[0]

    settle_until = time.monotonic() + options.settle
    while time.monotonic() < settle_until:
        collector.poll(wanted.__contains__)
        time.sleep(0.2)

    result = summarise(run, workload, collector, warmup_s, cpu_before, cpu_after, own_cpu)
    result["load_average_1m"] = round(load, 2)
    if direct_before is not None and direct_after is not None:
        # Of the events our ingest took, those pushed before its answer and never queued.
        ingested = direct_after[1] - direct_before[1]
        direct = direct_after[0] - direct_before[0]
        result["direct_share"] = direct / ingested if ingested else None
    # Every request radosgw served meanwhile (its own perf counter): the clients' PUTs, and
    # on our S3 store the store's requests too, which is what its CPU per event follows.
    served = (
        requests_after - requests_before
        if requests_before is not None and requests_after is not None
        else None
    )
    result["gateway_requests"] = served
    result["gateway_requests_per_event"] = (
        served / result["received"] if served is not None and result["received"] else None
    )
    return result


def _direct_counts(stack: Stack) -> tuple[float, float] | None:
    """Events delivered directly and events ingested, summed over our replicas' metrics;
    None for the gateway's scenarios or when a replica did not answer."""
    if not stack.ports:
        return None
    direct = ingested = 0.0
    for port in stack.ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                text = r.read().decode()
        except OSError:
            return None
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "bucketnotify_events_direct_total":
                    direct += sample.value
                elif sample.name == "pubsub_event_triggered_total":
                    ingested += sample.value
    return direct, ingested


def summarise(
    run: Run,
    workload: PutWorkload,
    collector: Collector,
    warmup_s: float,
    cpu_before: dict[str, float | None],
    cpu_after: dict[str, float | None],
    own_cpu: float,
) -> dict[str, Any]:
    log = workload.log
    put_ok = set(log.finished)
    received = [k for k in put_ok if k in collector.first]
    missing = sorted(put_ok - set(collector.first))
    first_put = min(log.started.values()) if log.started else 0.0
    last_put = max(log.finished.values()) if log.finished else first_put
    last_arrival = max((collector.first[k] for k in received), default=first_put)
    deliveries = sum(collector.deliveries.values())
    duplicates = deliveries - len(collector.first)
    span = last_arrival - first_put
    cpu: dict[str, float | None] = {}
    for name, before in cpu_before.items():
        after = cpu_after.get(name)
        cpu[name] = round(after - before, 2) if before is not None and after is not None else None
    cpu["bench (PUT clients)"] = round(own_cpu, 2)
    return {
        "events": run.options.events,
        "put_ok": len(put_ok),
        "put_failed": len(log.failed),
        "put_errors_sample": sorted(set(log.failed.values()))[:3],
        "received": len(received),
        "missing": len(missing),
        "missing_sample": missing[:10],
        "deliveries": deliveries,
        "duplicates": duplicates,
        "duplicates_per_event": duplicates / len(received) if received else None,
        "duplicates_per_1000": 1000 * duplicates / len(received) if received else None,
        "other_records": collector.other,
        "warmup_records": collector.warmup,
        "warmup_s": round(warmup_s, 2),
        "throughput_eps": len(received) / span if span > 0 else None,
        "put_rate_eps": len(put_ok) / (last_put - first_put) if last_put > first_put else None,
        "span_s": round(span, 3),
        "latency_ms": percentiles([collector.first[k] - log.started[k] for k in received]),
        "put_latency_ms": percentiles([log.finished[k] - log.started[k] for k in put_ok]),
        "cpu_s": cpu,
    }


def run_scenario(run: Run, scenario: Scenario) -> dict[str, Any]:
    started = time.monotonic()
    result: dict[str, Any] = {
        "scenario": scenario.name,
        "summary": scenario.summary,
        "config": asdict(scenario),
    }
    ours = Stack()
    with contextlib.ExitStack() as stack:
        try:
            receiver = stack.enter_context(Receiver(run.options.endpoint_delay_s))
            setup = {
                "gateway": setup_gateway,
                "relay": setup_relay,
                "bucketnotify": setup_bucketnotify,
            }[scenario.stack]
            setup(run, scenario, stack, receiver, ours)
            result["setup_s"] = round(time.monotonic() - started, 1)
            result.update(measure(run, run.bucket_name(scenario), receiver, ours))
            result["malformed_bodies"] = receiver.malformed
            if ours.proxy is not None:
                result["proxy_connections"] = ours.proxy.connections()
        except Exception as exc:
            result["error"] = f"{type(exc).__name__}: {exc}"
            print(f"  FAILED: {result['error']}", flush=True)
            traceback.print_exc()
            for program in ours.programs:
                print(f"  --- {program.name} log ({program.log_path}) ends:\n{program.tail(20)}")
        finally:
            result["logs"] = {p.name: str(p.log_path) for p in ours.programs}
            print("  cleaning up ...", flush=True)
    return result


# --- report ---------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    if ours is None or not theirs:
        return "-"
    ratio = ours / theirs
    # Three significant digits, but never in exponent notation.
    return f"{ratio:.0f}" if ratio >= 1000 else f"{ratio:.3g}"


def _figures(result: dict[str, Any]) -> dict[str, float | None]:
    latency = result.get("latency_ms") or {}
    return {
        "throughput_eps": result.get("throughput_eps"),
        "p50_ms": latency.get("p50"),
        "p99_ms": latency.get("p99"),
        "duplicates_per_event": result.get("duplicates_per_event"),
    }


def report(results: list[dict[str, Any]], cpus: int) -> tuple[str, dict[str, Any]]:
    header = (
        f"{'scenario':<34}{'events/s':>9}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}"
        f"{'dup/1000':>9}{'missing':>8}{'PUT/s':>8}{'PUT p99':>9}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        if "error" in r:
            lines.append(f"{r['scenario']:<34}FAILED: {r['error'][:80]}")
            continue
        lat, put = r["latency_ms"], r["put_latency_ms"]
        eps = _num(r["throughput_eps"]) + _lost_mark(r)
        lines.append(
            f"{r['scenario']:<34}{eps:>9}{_num(lat['p50']):>9}"
            f"{_num(lat['p90']):>9}{_num(lat['p99']):>9}{_num(lat['max']):>9}"
            f"{_num(r['duplicates_per_1000']):>9}{r['missing']:>8}"
            f"{_num(r['put_rate_eps']):>8}{_num(put['p99']):>9}"
        )

    lines += _losses([(None, r) for r in results])
    ok = [r for r in results if "error" not in r]
    if ok:
        lines += [
            "",
            "set-up, CPU seconds during the measurement (ours: replicas, operator, proxy; the"
            " relay's own) and"
            " the 1-minute load average at its end",
            f"{'scenario':<34}{'setup s':>9}{'warmup s':>9}{'ours':>9}{'radosgw':>9}"
            f"{'ceph-osd':>9}{'apiserver':>10}{'etcd':>7}{'load':>7}",
        ]
    for r in ok:
        cpu = r["cpu_s"]
        mine = sum(cpu[k] or 0 for k in _ours(cpu))
        lines.append(
            f"{r['scenario']:<34}{_num(r.get('setup_s'), 1):>9}{_num(r.get('warmup_s'), 1):>9}"
            f"{_num(mine if r['config']['stack'] != 'gateway' else None, 1):>9}"
            f"{_num(cpu.get('radosgw'), 1):>9}{_num(cpu.get('ceph-osd'), 1):>9}"
            f"{_num(cpu.get('kube-apiserver'), 1):>10}{_num(cpu.get('etcd'), 1):>7}"
            f"{_num(r.get('load_average_1m'), 1):>7}"
        )

    lines += cpu_per_event(ok)

    measured = {r["scenario"]: _figures(r) for r in ok}
    baselines: list[tuple[str, dict[str, float | None]]] = []
    for name in ("gateway-persistent", "gateway-sync"):
        if name in measured:
            baselines.append((f"{name} (this run)", measured[name]))
    ratios: dict[str, Any] = {}
    ours = [r for r in ok if r["config"]["stack"] != "gateway"]
    if ours and not baselines:
        # Figures of another run (another Ceph, another load) would make a ratio that means
        # nothing: a ratio is only ever taken within one run.
        lines += ["", "no ratios: run gateway-sync or gateway-persistent in the same run"]
    elif ours:
        lines += [
            "",
            "ratios ours / gateway (events/s: higher is better; latency: lower is better)",
            f"{'':<34}{'vs':<34}{'events/s':>9}{'p50':>9}{'p99':>9}",
        ]
    for r in ours:
        mine = _figures(r)
        ratios[r["scenario"]] = {}
        for i, (label, base) in enumerate(baselines):
            row = {
                "throughput": _ratio(mine["throughput_eps"], base["throughput_eps"]),
                "p50": _ratio(mine["p50_ms"], base["p50_ms"]),
                "p99": _ratio(mine["p99_ms"], base["p99_ms"]),
            }
            ratios[r["scenario"]][label] = {
                k: None if v == "-" else float(v) for k, v in row.items()
            }
            lines.append(
                f"{r['scenario'] if i == 0 else '':<34}{label:<34}"
                f"{row['throughput']:>9}{row['p50']:>9}{row['p99']:>9}"
            )
    lines += throughput_budget(ok, cpus)
    lines += shared_store_goals(ok)
    lines += warm_ups(ok)
    return "\n".join(lines), ratios


def _ours(cpu_s: dict[str, float | None]) -> list[str]:
    """The names of our processes among those whose CPU was measured."""
    return [k for k in cpu_s if k.startswith(("replica-", "operator", "proxy", "relay"))]


GOAL_OURS_MS = {"dir": 1.5}
"""CPU per delivered event, our processes only (issue 16)."""
GOAL_ALL_MS = {"s3": 3.0}
"""CPU per delivered event, ours plus the gateway's and the OSD's work beyond gateway-sync."""


def cpu_per_event(results: list[dict[str, Any]]) -> list[str]:
    """CPU milliseconds per delivered event: ours, and the gateway's and OSD's work beyond
    what the gateway-sync scenario of this run spent per event (its own push path)."""

    def per_event(r: dict[str, Any], *names: str) -> float | None:
        values = [r["cpu_s"].get(n) for n in names]
        if not r["received"] or any(v is None for v in values):
            return None
        return float(1000 * sum(v for v in values if v is not None) / int(r["received"]))

    base = next((r for r in results if r["scenario"] == "gateway-sync"), None)
    base_ms = per_event(base, "radosgw", "ceph-osd") if base is not None else None
    lines = [
        "",
        "CPU ms per delivered event: ours (replicas, operator, proxy; the relay's own); radosgw"
        " + ceph-osd, and"
        " their extra over gateway-sync's per event in this run; ours + extra against the goals;"
        " requests radosgw served per event (the PUT included); the share of events our ingest"
        " delivered directly, never queued",
        f"{'scenario':<34}{'ours':>9}{'rgw+osd':>9}{'extra':>9}{'all':>9}{'gw req':>9}"
        f"{'direct':>8}  goal",
    ]
    for r in results:
        ours_names = _ours(r["cpu_s"])
        ours = per_event(r, *ours_names) if r["config"]["stack"] != "gateway" else None
        gateway = per_event(r, "radosgw", "ceph-osd")
        extra = gateway - base_ms if gateway is not None and base_ms is not None else None
        everything = (ours or 0) + extra if extra is not None and ours is not None else None
        # The relay is no design of ours, only the floor of one: no goal applies to it.
        store = r["config"]["store"] if r["config"]["stack"] == "bucketnotify" else None
        goal = ""
        if ours is not None and store in GOAL_OURS_MS:
            limit = GOAL_OURS_MS[store]
            goal = f"ours <= {limit}: {'met' if ours <= limit else 'NOT met'}"
        elif everything is not None and store in GOAL_ALL_MS:
            limit = GOAL_ALL_MS[store]
            goal = f"all <= {limit}: {'met' if everything <= limit else 'NOT met'}"
        r["cpu_ms_per_event"] = {"ours": ours, "gateway": gateway, "extra": extra}
        lines.append(
            f"{r['scenario']:<34}{_num(ours, 2):>9}{_num(gateway, 2):>9}{_num(extra, 2):>9}"
            f"{_num(everything, 2):>9}{_num(r.get('gateway_requests_per_event'), 2):>9}"
            f"{_percent(r.get('direct_share')):>8}  {goal}"
        )
    return lines


SHARED_STORE_GOALS = {
    "gw req/event": 1.5,
    "events/s ratio": 0.8,
    "p99 ratio": 2.0,
    "CPU ratio": 1.5,
    "p50 over, s": 0.3,
    "p99 over, s": 1.0,
}
"""The s3:// store's goals against gateway-persistent of the same run (issue 45): gateway
requests per event (the upload's included); events/s and p99 as ratios; CPU per event of
every process measured (gateway, OSD, API server, clients, receiver and ours) as a ratio;
latency above the gateway's own persistent delivery, in seconds."""


def _all_cpu_ms(r: dict[str, Any]) -> float | None:
    values = r["cpu_s"].values()
    if not r["received"] or any(v is None for v in values):
        return None
    return float(1000 * sum(v for v in values if v is not None) / int(r["received"]))


def shared_store_goals(results: list[dict[str, Any]]) -> list[str]:
    """Each s3:// store scenario against its goals, or nothing without gateway-persistent."""
    base = next((r for r in results if r["scenario"] == "gateway-persistent"), None)
    mine = [
        r
        for r in results
        if r["config"]["stack"] == "bucketnotify" and r["config"]["store"] == "s3"
    ]
    if base is None or not mine:
        return []
    lines = [
        "",
        "s3:// store goals against gateway-persistent of this run (CPU: every process measured,"
        " per event; 'over': latency above the gateway's own)",
        f"{'scenario':<34}{'goal':<16}{'limit':>8}{'measured':>10}  verdict",
    ]
    for r in mine:
        base_cpu, cpu = _all_cpu_ms(base), _all_cpu_ms(r)
        lat, base_lat = r["latency_ms"], base["latency_ms"]
        measured: dict[str, float | None] = {
            "gw req/event": r.get("gateway_requests_per_event"),
            "events/s ratio": _quotient(r["throughput_eps"], base["throughput_eps"]),
            "p99 ratio": _quotient(lat["p99"], base_lat["p99"]),
            "CPU ratio": _quotient(cpu, base_cpu),
            "p50 over, s": (lat["p50"] - base_lat["p50"]) / 1000,
            "p99 over, s": (lat["p99"] - base_lat["p99"]) / 1000,
        }
        for i, (goal, limit) in enumerate(SHARED_STORE_GOALS.items()):
            value = measured[goal]
            at_least = goal == "events/s ratio"
            verdict = (
                "-"
                if value is None
                else "met"
                if (value >= limit if at_least else value <= limit)
                else "NOT met"
            )
            lines.append(
                f"{r['scenario'] if i == 0 else '':<34}{goal:<16}"
                f"{('>= ' if at_least else '<= ') + str(limit):>8}{_num(value, 2):>10}  {verdict}"
            )
        r["goals"] = {goal: measured[goal] for goal in SHARED_STORE_GOALS}
    return lines


def _quotient(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def warm_ups(results: list[dict[str, Any]]) -> list[str]:
    """How long the first event of each persistent hand-off took to arrive: the gateway
    picks up a new persistent topic's queue only at its next poll (about every 30 s), which
    no figure above includes (the warm-up ends before the measurement starts)."""
    persistent = [
        r for r in results if r["config"].get("persistent") and r.get("warmup_s") is not None
    ]
    if not persistent:
        return []
    lines = [
        "",
        "warm-up of a new Topic: seconds until its first event arrived (persistent: the"
        " gateway's queue of a new topic is picked up at its ~30 s poll)",
    ]
    lines += [f"{r['scenario']:<34}{_num(r['warmup_s'], 1):>9}" for r in persistent]
    return lines


GOAL_THROUGHPUT = {
    "bucketnotify-sync": ("gateway-sync", 0.9),
    "bucketnotify-persistent": ("gateway-persistent", 0.9),
    "bucketnotify-sync-s3": ("gateway-persistent", 0.8),
}
"""Events/s as a share of a gateway scenario's in the same run (issue 16)."""


def throughput_budget(results: list[dict[str, Any]], cpus: int) -> list[str]:
    """What each throughput goal leaves for our processes on this machine.

    Every process of a scenario shares the machine's cores: the gateway, its OSD, the PUT
    clients, the receiver, the API server and ours. At the goal's rate the cores give at
    most ``cpus / rate`` CPU seconds per event to all of them together; what the others
    spent per event in our scenario is taken off, and the rest is the most ours may spend
    for the goal to be reachable at all (an upper bound: it assumes every core fully busy,
    which eight clients waiting for their PUTs never achieve). ``busy`` is the share of
    the cores the measured processes used, for the baseline and for ours: close to each
    other and high, the throughput ratio is then the ratio of CPU per event."""
    by_name = {r["scenario"]: r for r in results}

    def busy(r: dict[str, Any]) -> float | None:
        span = r.get("span_s")
        if not span:
            return None
        return float(sum(v or 0 for v in r["cpu_s"].values()) / (cpus * span))

    rows = []
    for r in results:
        goal = GOAL_THROUGHPUT.get(r["scenario"])
        if goal is None or goal[0] not in by_name or not r["received"]:
            continue
        base_name, share = goal
        base = by_name[base_name]
        rate = share * base["throughput_eps"]
        available = 1000 * cpus / rate
        ours_names = _ours(r["cpu_s"])
        ours = 1000 * sum(r["cpu_s"][k] or 0 for k in ours_names) / r["received"]
        others = (
            1000 * sum(v or 0 for k, v in r["cpu_s"].items() if k not in ours_names) / r["received"]
        )
        budget = available - others
        r["throughput_budget"] = {
            "goal": f"{share:g}x {base_name}",
            "rate_eps": rate,
            "cpu_ms_per_event_available": available,
            "others_ms": others,
            "ours_budget_ms": budget,
            "ours_ms": ours,
            "busy": busy(r),
            "baseline_busy": busy(base),
        }
        rows.append(
            f"{r['scenario']:<26}{f'{share:g}x {base_name}':<24}{_num(rate):>7}"
            f"{_num(available, 2):>10}{_num(others, 2):>9}{_num(budget, 2):>9}{_num(ours, 2):>9}"
            f"{_percent(busy(base)):>9}{_percent(busy(r)):>7}"
        )
    if not rows:
        return []
    return [
        "",
        f"throughput goals against {cpus} CPUs: at the goal's rate the cores give 'CPU' ms per"
        " event to every process together; the others of our scenario (gateway, OSD, clients,"
        " receiver, API server) spent 'others'; ours must fit in 'budget' (an upper bound:"
        " every core fully busy); 'busy' is the share of the cores used, baseline and ours",
        f"{'scenario':<26}{'goal':<24}{'rate':>7}{'CPU':>10}{'others':>9}{'budget':>9}"
        f"{'ours':>9}{'busy':>9}{'ours':>7}",
        *rows,
    ]


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def ramp_report(steps: list[tuple[int, list[dict[str, Any]]]]) -> str:
    """Throughput and p99 per client count, one column pair per scenario: the knee of each
    curve is where throughput stops growing and p99 starts to."""
    names = [r["scenario"] for r in steps[0][1]] if steps else []
    header = f"{'clients':>8}" + "".join(f"{n[:26]:>28}" for n in names)
    lines = [
        "ramp: events/s and p99 ms of the first delivery, per number of PUT clients",
        header,
        f"{'':>8}" + "".join(f"{'events/s':>14}{'p99 ms':>14}" for _ in names),
    ]
    for clients, results in steps:
        row = f"{clients:>8}"
        for r in results:
            if "error" in r:
                row += f"{'FAILED':>28}"
            else:
                eps = _num(r["throughput_eps"]) + _lost_mark(r)
                row += f"{eps:>14}{_num(r['latency_ms']['p99']):>14}"
        lines.append(row)
    lines += _losses([(clients, r) for clients, results in steps for r in results])
    return "\n".join(lines)


def _lost_mark(result: dict[str, Any]) -> str:
    return "*" if result.get("put_failed") or result.get("missing") else ""


def _losses(results: list[tuple[int | None, dict[str, Any]]]) -> list[str]:
    """A line per scenario (and client count) that lost events: PUTs the gateway failed or
    never answered (their events are not counted as missing, and the time they took is in
    the span, so in events/s) and events that never arrived."""
    lines = []
    for clients, r in results:
        if "error" in r or not _lost_mark(r):
            continue
        where = r["scenario"] if clients is None else f"{r['scenario']}, {clients} clients"
        line = f"  {where}: {r.get('put_failed', 0)} PUTs failed, {r['missing']} events missing"
        if r.get("put_errors_sample"):
            line += f" (first error: {r['put_errors_sample'][0]})"
        lines.append(line)
    if lines:
        lines[:0] = ["", "* lost: PUTs that failed and events that never arrived"]
    return lines


def source_revision() -> dict[str, Any]:
    """The commit measured, and what differed from it: the figures depend on both."""

    def git(*args: str) -> str:
        result = subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
        )
        return result.stdout.strip()

    changed = git("status", "--porcelain", "--", "operator", "crds").splitlines()
    return {"commit": git("rev-parse", "HEAD") or None, "uncommitted": changed}


# --- entry point ----------------------------------------------------------------------------


def ramp(
    counts: list[int],
    options: Options,
    chosen: dict[str, Scenario],
    rgw: Service,
    kube: Service | None,
    out: Path,
) -> int:
    """The chosen scenarios at each client count, each set up afresh."""
    steps: list[tuple[int, list[dict[str, Any]]]] = []
    load_before = os.getloadavg()
    for clients in counts:
        run = Run(replace(options, clients=clients), rgw, kube, out, benchmark="ramp")
        results = []
        for scenario in chosen.values():
            print(f"== {clients} clients, {scenario.name}: {scenario.summary}", flush=True)
            results.append(run_scenario(run, scenario))
        steps.append((clients, results))
    path = out / f"ramp-{time.strftime('%Y%m%d-%H%M%S')}.json"
    document = {
        "benchmark": "delivery ramp",
        "host": {"cpus": os.cpu_count(), "load_average_before": load_before},
        "source": source_revision(),
        "options": asdict(options),
        "steps": [{"clients": c, "scenarios": r} for c, r in steps],
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    print()
    print(ramp_report(steps))
    print(f"\nresults: {path}")
    return 1 if any("error" in r for _, results in steps for r in results) else 0


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM unwinds like Ctrl-C, so every ExitStack stops what it started.
    raise KeyboardInterrupt


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, dict[str, Scenario]]:
    parser = argparse.ArgumentParser(
        prog="python -m bench.delivery",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--events", type=int, default=2000, help="events per scenario")
    parser.add_argument("--clients", type=int, default=8, help="concurrent PUT clients")
    parser.add_argument("--size", type=int, default=100, help="object size in bytes")
    parser.add_argument(
        "--scenarios", default="all", help="comma-separated subset of the scenarios, or 'all'"
    )
    parser.add_argument(
        "--s3-replicas",
        type=int,
        default=2,
        help="delivery replicas of bucketnotify-sync-s3 (more than 1: behind a proxy)",
    )
    parser.add_argument(
        "--shards", type=int, default=None, help="queue shards of our Topic (default: its own)"
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=60.0,
        help="give up on missing events after this many seconds without a new one",
    )
    parser.add_argument(
        "--settle", type=float, default=5.0, help="seconds to keep listening for late duplicates"
    )
    parser.add_argument(
        "--setup-timeout", type=float, default=90.0, help="seconds each set-up step may take"
    )
    parser.add_argument(
        "--ramp",
        default=None,
        help="comma-separated client counts (e.g. 1,8,32,64): run the scenarios at each and"
        " print throughput and p99 per step (--clients is then ignored)",
    )
    parser.add_argument(
        "--endpoint-delay-ms",
        type=float,
        default=0.0,
        help="the endpoint answers this long after each push arrived (a slow endpoint;"
        " latency still counts to the arrival)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run our processes under cProfile (a .prof file beside each log)",
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "results", help="directory of the results"
    )
    args = parser.parse_args(argv)
    known = scenarios(args.s3_replicas)
    if args.scenarios == "all":
        chosen = known
    else:
        names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown:
            parser.error(f"unknown scenario(s) {unknown}; choose from {list(known)}")
        chosen = {n: known[n] for n in names}
    if args.events < 1 or args.clients < 1 or args.s3_replicas < 1:
        parser.error("--events, --clients and --s3-replicas must be at least 1")
    if args.endpoint_delay_ms < 0:
        parser.error("--endpoint-delay-ms cannot be negative")
    if args.ramp is not None:
        try:
            args.ramp = [int(c) for c in args.ramp.split(",") if c.strip()]
        except ValueError:
            parser.error(f"--ramp takes client counts like 1,8,32,64, not {args.ramp!r}")
        if not args.ramp or min(args.ramp) < 1:
            parser.error("--ramp needs client counts of at least 1")
    return args, chosen


def main(argv: list[str] | None = None) -> int:
    args, chosen = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    options = Options(
        events=args.events,
        clients=args.clients,
        size=args.size,
        idle_timeout=args.idle_timeout,
        settle=args.settle,
        setup_timeout=args.setup_timeout,
        shards=args.shards,
        profile=args.profile,
        endpoint_delay_s=args.endpoint_delay_ms / 1000,
    )

    def benchmark(started: list[Service]) -> int:
        rgw = services.start("ceph")
        started.append(rgw)
        kube = None
        if any(s.stack == "bucketnotify" for s in chosen.values()):
            kube = services.start("kube")
            started.append(kube)
        run = Run(options, rgw, kube, args.out)
        if run.kubectl is not None:
            run.kubectl.install_crds()
        if args.ramp:
            return ramp(args.ramp, options, chosen, rgw, kube, args.out)
        load_before = os.getloadavg()
        results = []
        for scenario in chosen.values():
            print(f"== {scenario.name}: {scenario.summary}", flush=True)
            results.append(run_scenario(run, scenario))
        table, ratios = report(results, os.cpu_count() or 1)
        path = args.out / f"delivery-{run.id}.json"
        document = {
            "benchmark": "delivery",
            "started": run.id,
            "host": {
                "cpus": os.cpu_count(),
                # Other work on the machine shows in every figure; this says how much there was.
                "load_average_before": load_before,
                "load_average_after": os.getloadavg(),
                "python": platform.python_version(),
                "platform": platform.platform(),
            },
            "source": source_revision(),
            "options": asdict(options),
            "scenarios": results,
            "ratios": ratios,
            "logs": str(run.log_dir),
        }
        path.write_text(json.dumps(document, indent=2) + "\n")
        print()
        print(
            f"delivery benchmark: {options.events} events x {options.clients} clients, "
            f"{options.size}-byte objects, {EVENT}; "
            + (
                f"the endpoint answers {1000 * options.endpoint_delay_s:g} ms late; "
                if options.endpoint_delay_s
                else ""
            )
            + f"{os.cpu_count()} CPUs, load average "
            f"{load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after"
        )
        print(table)
        print(f"\nresults: {path}\nlogs:    {run.log_dir}")
        return 1 if any("error" in r for r in results) else 0

    return guarded("bench", benchmark)


if __name__ == "__main__":
    sys.exit(main())
