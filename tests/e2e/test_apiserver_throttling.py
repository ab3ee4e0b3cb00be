"""An API server that answers 429 (Too Many Requests) to the operator and the delivery
replicas, as a busy cluster's API Priority and Fairness does to a workload it holds to a
small share: everything slows down, nothing is lost, and nothing is logged as an ERROR or
with a traceback (a 429 is the API server asking to be asked again later, not something a
person must act on)."""

from __future__ import annotations

import collections
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devstack.servers.recording import RecordingHttpServer
from tests.faults.pipeline import HttpTarget, Pipeline, Stream, settle
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.serviceaccounts import token_kubeconfig

pytestmark = pytest.mark.timeout(600)

PROGRAMS = ("operator", "delivery")
NEIGHBOUR = "neighbour"
"""Another workload of the same priority level: in bursts it keeps the level's few seats
busy, as the other tenants of a busy cluster do, so that what our programs ask meets a
full level (429) about as often as a burst lasts, and gets through between them. Busy all
the time, it starved the operator's leader Lease on a loaded machine: a cluster that
never lets a workload through is not what this test is about."""
NEIGHBOUR_CLIENTS = 3
BURST_S, PERIOD_S = 0.5, 1.37
"""A period no renew interval is a multiple of: with 1 s, every Lease round of a replica
(3 s apart) fell in a burst, every time."""
PER_SECOND = 8
STREAM_S = 20
READY_WITHIN_S = 240


def rejected(kubectl: Kubectl, flow_schema: str) -> float:
    """Requests the API server refused (429) under ``flow_schema``, from its own metrics."""
    total = 0.0
    for line in kubectl.run("get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith("apiserver_flowcontrol_rejected_requests_total{") and (
            f'flow_schema="{flow_schema}"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture()
def throttled(kube: LocalService, kubectl: Kubectl, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A ServiceAccount per program (and the neighbour) with every right, each of them held
    by API Priority and Fairness to one priority level of the smallest share (the API
    server gives it 3 of its 600 seats) that rejects what does not fit at once. Returns
    program → kubeconfig, ``<program>-schema`` → its FlowSchema's name, and ``neighbour``
    → the neighbour's token."""
    name = f"throttled-{uuid.uuid4().hex[:8]}"
    kubectl.run("create", "namespace", name)
    made: list[tuple[str, str]] = []

    def create(manifest: dict[str, object]) -> None:
        kubectl.run("apply", "-f", "-", stdin=json.dumps(manifest))
        made.append((str(manifest["kind"]).lower(), name_of(manifest)))

    create(
        {
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "PriorityLevelConfiguration",
            "metadata": {"name": name},
            "spec": {
                "type": "Limited",
                "limited": {
                    "nominalConcurrencyShares": 1,
                    "lendablePercent": 0,
                    "borrowingLimitPercent": 0,
                    "limitResponse": {"type": "Reject"},
                },
            },
        }
    )
    found: dict[str, str] = {}
    for program in (*PROGRAMS, NEIGHBOUR):
        account = f"{program}-sa"
        kubectl.run("create", "serviceaccount", account, "-n", name)
        create(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": f"{name}-{program}"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "cluster-admin",
                },
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": name}],
            }
        )
        every = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}
        create(
            flow_schema(
                f"{name}-{program}",
                (account, name),
                level=name,
                # Before every built-in schema but the exempt ones (1 and up).
                precedence=100,
                resource_rules=[{**every, "namespaces": ["*"]}, {**every, "clusterScope": True}],
                non_resource_rules=[{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            )
        )
        if program in PROGRAMS:
            # As docs/operator.md asks of a cluster that throttles: the Leases (leader,
            # members, partitions) in the built-in leader-election level, so that a busy
            # level cannot make a leader miss its renewals and stop.
            leases = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"]}
            create(
                flow_schema(
                    f"{name}-{program}-leases",
                    (account, name),
                    level="leader-election",
                    precedence=90,
                    resource_rules=[{"verbs": ["*"], **leases, "namespaces": ["*"]}],
                )
            )
        found[program] = token_kubeconfig(kube, kubectl, name, account, tmp_path)
        found[f"{program}-schema"] = f"{name}-{program}"
    found[NEIGHBOUR] = kubectl.run(
        "create", "token", f"{NEIGHBOUR}-sa", "-n", name, "--duration=1h"
    ).stdout.strip()
    yield found
    for kind, object_name in reversed(made):
        kubectl.run("delete", kind, object_name, "--ignore-not-found")
    kubectl.run("delete", "namespace", name, "--wait=false")


class Neighbour:
    """Clients listing every Topic of the cluster back to back with the neighbour's token
    for BURST_S of every PERIOD_S, while in the ``with`` block."""

    def __init__(self, kube: LocalService, token: str) -> None:
        self._client = httpx.Client(
            base_url=kube["KUBE_SERVER"],
            verify=kube["KUBE_CA_CERT"],
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._list) for _ in range(NEIGHBOUR_CLIENTS)]
        self.answers: collections.Counter[int] = collections.Counter()

    def __enter__(self) -> Neighbour:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self._client.close()

    def _list(self) -> None:
        while not self._stop.is_set():
            pause = PERIOD_S - time.monotonic() % PERIOD_S
            if pause < PERIOD_S - BURST_S:
                self._stop.wait(pause)
                continue
            with contextlib.suppress(httpx.HTTPError):
                answer = self._client.get("/apis/bucketnotify.io/v1alpha1/topics")
                self.answers[answer.status_code] += 1


def flow_schema(
    name: str,
    account: tuple[str, str],
    *,
    level: str,
    precedence: int,
    resource_rules: list[dict[str, object]],
    non_resource_rules: list[dict[str, object]] | None = None,
) -> dict[str, object]:
    """A FlowSchema sending the requests of the ServiceAccount ``account`` (name, namespace)
    that the rules match to the priority level ``level``, one flow per user."""
    service_account = {"name": account[0], "namespace": account[1]}
    rule: dict[str, object] = {
        "subjects": [{"kind": "ServiceAccount", "serviceAccount": service_account}],
        "resourceRules": resource_rules,
    }
    if non_resource_rules:
        rule["nonResourceRules"] = non_resource_rules
    return {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": name},
        "spec": {
            "priorityLevelConfiguration": {"name": level},
            "matchingPrecedence": precedence,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [rule],
        },
    }


def name_of(manifest: dict[str, object]) -> str:
    metadata = manifest["metadata"]
    assert isinstance(metadata, dict)
    return str(metadata["name"])


def troubles(log: str) -> list[str]:
    """The lines of a program's JSON log at ERROR or above, or carrying a traceback."""
    found = []
    for line in log.splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            found.append(line)  # not ours: a library printing on its own, or a crash
            continue
        severe = entry.get("severity") in ("error", "critical")
        if severe or "exc_info" in entry or "Traceback" in line:
            found.append(line)
    return found


def test_an_apiserver_answering_429_slows_nothing_down_to_a_loss_or_an_error(
    kube: LocalService, rgw: LocalService, kubectl: Kubectl, throttled: dict[str, str]
) -> None:
    """The operator and two replicas start, reconcile two persistent Topics (hand-off sync
    and persistent) and their BucketNotifications, and deliver a stream of uploads, all
    under the throttling: the API server refuses some of both programs' requests with 429.
    Every Topic and BucketNotification gets Ready, every acknowledged upload arrives once,
    and no log line of the run is an ERROR or holds a traceback."""
    schemas = {p: throttled[f"{p}-schema"] for p in PROGRAMS}
    before = {p: rejected(kubectl, schema) for p, schema in schemas.items()}
    with Neighbour(kube, throttled[NEIGHBOUR]) as neighbour:
        pipeline = Pipeline(kube, rgw, replicas=2, kubeconfigs={p: throttled[p] for p in PROGRAMS})
        try:
            with RecordingHttpServer() as receiver:
                target = HttpTarget(receiver)
                # Every Topic and BucketNotification Ready: slower than unthrottled (kopf
                # backs off after each 429), so waited for longer; Ready is what counts.
                buckets = pipeline.topics(target, ready_within=READY_WITHIN_S)
                with Stream(rgw, list(buckets.values()), PER_SECOND) as stream:
                    time.sleep(STREAM_S)
                outcomes = settle(stream, target, buckets, 240)
            refused = {p: rejected(kubectl, s) - before[p] for p, s in schemas.items()}
            logs = {"operator": pipeline.operator.log() if pipeline.operator else ""}
            logs.update({name: r.log() for name, r in pipeline.cluster.replicas.items()})
        finally:
            pipeline.close()
    print(f"answered 429: {refused}; the neighbour's answers: {dict(neighbour.answers)}")
    assert all(refused.values()), f"the API server refused none of a program's requests: {refused}"
    for outcome in outcomes:
        assert outcome.acked > 0, outcome.line()
        assert not outcome.lost, outcome.line()
        assert outcome.duplicates == 0, outcome.line()
    for program, log in logs.items():
        bad = troubles(log)
        assert not bad, f"{program} logged an error or a traceback:\n" + "\n".join(bad[:10])
