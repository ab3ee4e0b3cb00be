"""Failover benchmark: kill -9 the delivery replica owning the most shards under a steady stream.

``python -m bench.failover [--rounds 3] [--rate 20]`` (``make bench``). Each round sets up,
as ``bench.delivery``'s ``bucketnotify`` scenarios do, 3 delivery replicas sharing an S3
queue store on the gateway behind a round-robin proxy (a Service's part), the operator, and a
persistent Topic (hand-off ``persistent``) with a BucketNotification; then PUTs objects at
``--rate`` a second, kills (SIGKILL) the replica whose Leases cover most of the Topic's shards
``--before`` seconds into the stream, keeps the stream going ``--after`` seconds more, and
waits until every event reached the endpoint (or none arrived for ``--idle-timeout``).

Figures per round: seconds from the kill to the first delivery of an event of the killed
replica's shards (deliveries resuming), to the survivors holding every partition Lease
(ownership), the longest pause of the other shards' deliveries around the kill, events lost
(PUT acknowledged, never delivered: must be 0), duplicates per 1,000 events. Over the rounds:
min/median/max, and the ratio to the gateway's own failover of its persistent queues
(reference: a cls lock renewed every 30 s, taken over when not renewed for 90 s, i.e. 60 to
120 s after an owner dies, 90 s on average).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import signal
import statistics
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from tests.delivery import partition_holders

from bench.delivery import (
    PARTITIONS,
    Run,
    Scenario,
    Stack,
    setup_bucketnotify,
    source_revision,
    warm_up,
)
from bench.delivery import Options as DeliveryOptions
from bench.guarded import guarded
from bench.workload import Collector, object_body, percentiles
from bucketnotify.delivery.model.event import shard_of
from bucketnotify.delivery.model.queue import QueueName
from bucketnotify.delivery.peers.ownership import partition_of
from devstack import services
from devstack.servers.arrivals import Receiver
from devstack.services import REPO, Service

TOPIC = "bench"  # what setup_bucketnotify names the Topic
REPLICAS = 3
# The delivery service's defaults (settings.py): a dead owner's Leases expire 12 s after
# its last renewal and the survivors look every 3 s.
OUR_BOUND_S = 12 + 3
# The gateway's own persistent queues (reference: persistent-notifications-deep-dive.md,
# "Queue Ownership"): every 30 s each RGW renews its locks and takes unlocked queues; a lock
# not renewed for 90 s is free. A kill lands 0-30 s after the last renewal, so the queue is
# free 60-90 s after the kill and taken at the next 0-30 s scan.
GATEWAY_FAILOVER_S = {"min": 60.0, "mean": 90.0, "max": 120.0}
# What a platform team can accept around one replica kill per round at 20 PUT/s.
DUPLICATES_GOAL_PER_1000 = 1.0
# A killed replica's last pushes may be counted by the endpoint a moment after the kill.
IN_FLIGHT_MARGIN_S = 0.5


@dataclass(frozen=True)
class Options:
    rounds: int
    rate: float
    clients: int
    before: float
    after: float
    shards: int
    idle_timeout: float
    settle: float
    setup_timeout: float


class PacedWorkload:
    """PUTs of new keys at ``rate`` a second, shared by ``clients`` threads, until stopped.

    A steady stream, not a flood: failover is measured on the gaps it leaves.
    """

    def __init__(self, clients: list[Any], bucket: str, prefix: str, rate: float) -> None:
        self.started: dict[str, float] = {}
        self.finished: dict[str, float] = {}
        self.failed: dict[str, str] = {}
        self._bucket = bucket
        self._prefix = prefix
        self._interval = 1 / rate
        self._next = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._t0 = 0.0
        self._threads = [
            threading.Thread(target=self._put, args=(c,), name=f"paced-{i}", daemon=True)
            for i, c in enumerate(clients)
        ]

    def _take(self) -> tuple[str, float]:
        with self._lock:
            index = self._next
            self._next += 1
        return f"{self._prefix}{index:06d}", self._t0 + index * self._interval

    def _put(self, client: Any) -> None:
        while not self._stop.is_set():
            key, due = self._take()
            # A late thread does not catch up with a burst: the schedule is the stream.
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return
            self.started[key] = time.time()
            try:
                client.put_object(Bucket=self._bucket, Key=key, Body=object_body(key, 100))
            except (BotoCoreError, ClientError) as exc:
                self.failed[key] = str(exc)
            else:
                self.finished[key] = time.time()

    def start(self) -> None:
        self._t0 = time.monotonic()
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=70)


def longest_gap(times: list[float], start: float, end: float) -> float | None:
    """Longest interval without an arrival within [start, end], its ends included."""
    inside = sorted(t for t in times if start <= t <= end)
    if not inside:
        return None
    points = [start, *inside, end]
    return max(b - a for a, b in itertools.pairwise(points))


def kill_round(
    run: Run, options: Options, index: int, bucket: str, receiver: Receiver, ours: Stack
) -> dict[str, Any]:
    assert run.kubectl is not None and ours.namespace is not None
    kubectl, namespace = run.kubectl, ours.namespace
    result: dict[str, Any] = {"round": index, "namespace": namespace}
    result["warmup_s"] = round(warm_up(run, bucket, receiver, ours), 2)

    prefix = f"r{index}-"
    collector = Collector(receiver)

    def wanted(key: str) -> bool:
        return key.startswith(prefix)

    workload = PacedWorkload(run.clients, bucket, prefix, options.rate)
    queue = QueueName(namespace, TOPIC)
    replicas = {p.name: p for p in ours.programs if p.name.startswith("replica-")}

    print(f"  stream of {options.rate:g} PUT/s; kill in {options.before:g} s", flush=True)
    workload.start()
    try:
        until = time.monotonic() + options.before
        while time.monotonic() < until:
            collector.poll(wanted)
            ours.check_alive()
            time.sleep(0.1)
        holders = partition_holders(kubectl, namespace)
        owner_of = {
            s: holders.get(partition_of(queue, s, PARTITIONS)) for s in range(options.shards)
        }
        victim = Counter(o for o in owner_of.values() if o).most_common(1)[0][0]
        victim_shards = sorted(s for s, o in owner_of.items() if o == victim)
        killed_at = time.time()
        replicas[victim].process.kill()
        replicas[victim].process.wait()
        ours.programs.remove(replicas[victim])
        print(f"  killed {victim} (shards {victim_shards} of {options.shards})", flush=True)

        takeover_s: float | None = None
        until = time.monotonic() + options.after
        next_lease_look = 0.0
        while time.monotonic() < until:
            collector.poll(wanted)
            if takeover_s is None and time.monotonic() >= next_lease_look:
                held = partition_holders(kubectl, namespace)
                if len(held) == PARTITIONS and victim not in held.values():
                    takeover_s = time.time() - killed_at
                next_lease_look = time.monotonic() + 0.5
            ours.check_alive()
            time.sleep(0.1)
    finally:
        workload.stop()

    # Every acknowledged PUT must arrive; give up only when nothing new came for a while.
    while not all(k in collector.first for k in workload.finished):
        if collector.poll(wanted) == 0 and (
            time.monotonic() - collector.last_new > options.idle_timeout
        ):
            break
        ours.check_alive()
        time.sleep(0.2)
    settle_until = time.monotonic() + options.settle
    while time.monotonic() < settle_until:
        collector.poll(wanted)
        time.sleep(0.2)
    load = os.getloadavg()[0]

    def in_victim_shard(key: str) -> bool:
        return shard_of(bucket, key, options.shards) in victim_shards

    victim_first = {k: t for k, t in collector.first.items() if in_victim_shard(k)}
    other_first = {k: t for k, t in collector.first.items() if not in_victim_shard(k)}
    after_kill = [t for t in victim_first.values() if t > killed_at + IN_FLIGHT_MARGIN_S]
    before_kill = [t for t in victim_first.values() if t <= killed_at + IN_FLIGHT_MARGIN_S]
    resumed_s = min(after_kill) - killed_at if after_kill else None
    pending_at_kill = [
        k
        for k, started in workload.started.items()
        if in_victim_shard(k) and started < killed_at and collector.first.get(k, 1e18) > killed_at
    ]
    put_ok = set(workload.finished)
    lost = sorted(put_ok - set(collector.first))
    deliveries = sum(collector.deliveries.values())
    duplicates = deliveries - len(collector.first)
    victim_duplicates = sum(
        n - 1 for (k, _e), n in collector.deliveries.items() if in_victim_shard(k) and n > 1
    )
    window_end = killed_at + (resumed_s or options.after) + 5
    result.update(
        {
            "victim": victim,
            "victim_shards": victim_shards,
            "holders_at_kill": dict(Counter(holders.values())),
            "resumed_s": round(resumed_s, 2) if resumed_s is not None else None,
            "victim_shards_gap_s": (
                round(min(after_kill) - max(before_kill), 2) if after_kill and before_kill else None
            ),
            "takeover_s": round(takeover_s, 2) if takeover_s is not None else None,
            "other_shards_longest_gap_s": _round(
                longest_gap(list(other_first.values()), killed_at - 5, window_end)
            ),
            "events_put": len(put_ok),
            "put_failed": len(workload.failed),
            "put_errors_sample": sorted(set(workload.failed.values()))[:3],
            "pending_at_kill": len(pending_at_kill),
            "lost": len(lost),
            "lost_sample": lost[:10],
            "deliveries": deliveries,
            "duplicates": duplicates,
            "duplicates_per_1000": round(1000 * duplicates / len(collector.first), 2)
            if collector.first
            else None,
            "duplicates_in_victim_shards": victim_duplicates,
            "latency_ms_pending_at_kill": percentiles(
                [
                    collector.first[k] - workload.started[k]
                    for k in pending_at_kill
                    if k in collector.first
                ]
            ),
            "latency_ms_all": percentiles(
                [collector.first[k] - workload.started[k] for k in put_ok if k in collector.first]
            ),
            "other_records": collector.other,
            "load_average_1m": round(load, 2),
        }
    )
    return result


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def run_round(run: Run, options: Options, index: int) -> dict[str, Any]:
    scenario = Scenario(
        f"failover-{index}",
        f"{REPLICAS} replicas, S3 store, hand-off persistent; kill -9 the busiest owner",
        "bucketnotify",
        persistent=True,
        store="s3",
        replicas=REPLICAS,
    )
    print(f"== round {index}: {scenario.summary}", flush=True)
    started = time.monotonic()
    ours = Stack()
    result: dict[str, Any] = {"round": index}
    with contextlib.ExitStack() as stack:
        try:
            receiver = stack.enter_context(Receiver())
            setup_bucketnotify(run, scenario, stack, receiver, ours)
            result["setup_s"] = round(time.monotonic() - started, 1)
            bucket = run.bucket_name(scenario)
            result.update(kill_round(run, options, index, bucket, receiver, ours))
            print(
                f"  resumed after {result['resumed_s']} s, Leases taken after "
                f"{result['takeover_s']} s; lost {result['lost']}, duplicates "
                f"{result['duplicates']} of {result['events_put']} events",
                flush=True,
            )
        except Exception as exc:
            result["error"] = f"{type(exc).__name__}: {exc}"
            print(f"  FAILED: {result['error']}", flush=True)
            traceback.print_exc()
            for program in ours.programs:
                print(f"  --- {program.name} log ({program.log_path}) ends:\n{program.tail(20)}")
        finally:
            result["logs"] = str(run.log_dir / scenario.name)
            print("  cleaning up ...", flush=True)
    return result


# --- report ---------------------------------------------------------------------------------


def spread(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"min": None, "median": None, "max": None}
    return {
        "min": round(min(values), 2),
        "median": round(statistics.median(values), 2),
        "max": round(max(values), 2),
    }


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rounds if "error" not in r]

    def figures(key: str) -> list[float]:
        return [float(r[key]) for r in ok if r.get(key) is not None]

    resumed = spread(figures("resumed_s"))
    events = sum(r["events_put"] for r in ok)
    duplicates = sum(r["duplicates"] for r in ok)
    ratios = None
    if resumed["median"] is not None and resumed["max"] is not None:
        ratios = {
            "median_vs_gateway_mean": round(resumed["median"] / GATEWAY_FAILOVER_S["mean"], 3),
            "max_vs_gateway_max": round(resumed["max"] / GATEWAY_FAILOVER_S["max"], 3),
            "max_vs_gateway_min": round(resumed["max"] / GATEWAY_FAILOVER_S["min"], 3),
        }
    return {
        "rounds_ok": len(ok),
        "rounds_failed": len(rounds) - len(ok),
        "resumed_s": resumed,
        "takeover_s": spread(figures("takeover_s")),
        "other_shards_longest_gap_s": spread(figures("other_shards_longest_gap_s")),
        "events": events,
        "lost": sum(r["lost"] for r in ok),
        "put_failed": sum(r["put_failed"] for r in ok),
        "duplicates": duplicates,
        "duplicates_per_1000": round(1000 * duplicates / events, 2) if events else None,
        "gateway_documented_failover_s": GATEWAY_FAILOVER_S,
        "our_configured_bound_s": OUR_BOUND_S,
        "ratios": ratios,
    }


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(rounds: list[dict[str, Any]], total: dict[str, Any]) -> str:
    header = (
        f"{'round':<7}{'victim':<11}{'shards':>7}{'resumed s':>10}{'Leases s':>9}"
        f"{'others gap s':>13}{'pending':>8}{'events':>7}{'lost':>5}{'dup/1000':>9}{'load':>6}"
    )
    lines = [header, "-" * len(header)]
    for r in rounds:
        if "error" in r:
            lines.append(f"{r['round']:<7}FAILED: {r['error'][:90]}")
            continue
        lines.append(
            f"{r['round']:<7}{r['victim']:<11}{len(r['victim_shards']):>7}"
            f"{_num(r['resumed_s']):>10}{_num(r['takeover_s']):>9}"
            f"{_num(r['other_shards_longest_gap_s']):>13}{r['pending_at_kill']:>8}"
            f"{r['events_put']:>7}{r['lost']:>5}{_num(r['duplicates_per_1000']):>9}"
            f"{_num(r['load_average_1m']):>6}"
        )
    res = total["resumed_s"]
    lines += [
        "",
        f"deliveries resumed after the kill: min {_num(res['min'])} s, median "
        f"{_num(res['median'])} s, max {_num(res['max'])} s (our Lease bound "
        f"{OUR_BOUND_S} s); lost {total['lost']} of {total['events']} events; "
        f"{_num(total['duplicates_per_1000'])} duplicates per 1000 (goal: at most "
        f"{DUPLICATES_GOAL_PER_1000:g})",
        f"gateway's own failover (documented: renew every 30 s, expire after 90 s): "
        f"{GATEWAY_FAILOVER_S['min']:.0f}-{GATEWAY_FAILOVER_S['max']:.0f} s, "
        f"{GATEWAY_FAILOVER_S['mean']:.0f} s on average",
    ]
    ratios = total["ratios"]
    if ratios:
        lines.append(
            f"ratio ours / gateway: median / average {ratios['median_vs_gateway_mean']:.3f}, "
            f"max / max {ratios['max_vs_gateway_max']:.3f}, max / best case "
            f"{ratios['max_vs_gateway_min']:.3f}"
        )
    return "\n".join(lines)


# --- entry point ----------------------------------------------------------------------------


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.failover",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=3, help="kills, each on a fresh set-up")
    parser.add_argument("--rate", type=float, default=20.0, help="PUTs a second of the stream")
    parser.add_argument("--clients", type=int, default=2, help="PUT threads sharing the stream")
    parser.add_argument(
        "--before", type=float, default=10.0, help="seconds of stream before the kill"
    )
    parser.add_argument(
        "--after",
        type=float,
        default=30.0,
        help=f"seconds of stream after the kill (more than our {OUR_BOUND_S} s bound)",
    )
    parser.add_argument("--shards", type=int, default=11, help="queue shards of the Topic")
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=120.0,
        help="count the rest lost after this many seconds without a new event",
    )
    parser.add_argument(
        "--settle", type=float, default=5.0, help="seconds to keep listening for duplicates"
    )
    parser.add_argument(
        "--setup-timeout", type=float, default=90.0, help="seconds each set-up step may take"
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "results", help="directory of the results"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.rate <= 0 or args.clients < 1 or args.shards < 1:
        parser.error("--rounds, --clients, --shards must be at least 1 and --rate above 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    options = Options(
        rounds=args.rounds,
        rate=args.rate,
        clients=args.clients,
        before=args.before,
        after=args.after,
        shards=args.shards,
        idle_timeout=args.idle_timeout,
        settle=args.settle,
        setup_timeout=args.setup_timeout,
    )

    def benchmark(started: list[Service]) -> int:
        rgw = services.start("ceph")
        started.append(rgw)
        kube = services.start("kube")
        started.append(kube)
        delivery_options = DeliveryOptions(
            events=0,
            clients=args.clients,
            size=100,
            idle_timeout=args.idle_timeout,
            settle=args.settle,
            setup_timeout=args.setup_timeout,
            shards=args.shards,
            profile=False,
        )
        run = Run(delivery_options, rgw, kube, args.out, benchmark="failover")
        assert run.kubectl is not None
        run.kubectl.install_crds()
        load_before = os.getloadavg()
        rounds = [run_round(run, options, i + 1) for i in range(options.rounds)]
        total = summary(rounds)
        path = args.out / f"{run.id}-failover.json"
        document = {
            "benchmark": "failover",
            "started": run.id,
            "host": {
                "cpus": os.cpu_count(),
                "load_average_before": load_before,
                "load_average_after": os.getloadavg(),
                "python": platform.python_version(),
                "platform": platform.platform(),
            },
            "source": source_revision(),
            "options": asdict(options),
            "summary": total,
            "rounds": rounds,
            "logs": str(run.log_dir),
        }
        path.write_text(json.dumps(document, indent=2) + "\n")
        print()
        print(
            f"failover benchmark: {options.rounds} round(s), {REPLICAS} replicas, "
            f"{options.rate:g} PUT/s, {options.shards} shards, {PARTITIONS} partitions; "
            f"{os.cpu_count()} CPUs, load average {load_before[0]:.1f} before, "
            f"{os.getloadavg()[0]:.1f} after"
        )
        print(report(rounds, total))
        print(f"\nresults: {path}\nlogs:    {run.log_dir}")
        return 1 if total["rounds_failed"] else 0

    return guarded("bench", benchmark)


if __name__ == "__main__":
    sys.exit(main())
