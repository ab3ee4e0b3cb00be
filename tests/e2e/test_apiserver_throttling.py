"""An API server that answers 429 (Too Many Requests) to the operator and the delivery
replicas, as a busy cluster's API Priority and Fairness does to a workload it holds to a
small share: everything slows down, nothing is lost, and nothing is logged as an ERROR or
with a traceback (a 429 is the API server asking to be asked again later, not something a
person must act on)."""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.servers.recording import RecordingHttpServer
from tests.faults.pipeline import HttpTarget, Pipeline, Stream, settle
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.serviceaccounts import token_kubeconfig
from tests.tls import CertificateAuthority, ServerCertificate, issue_server_certificate, make_ca

pytestmark = pytest.mark.timeout(600)

PROGRAMS = ("operator", "delivery")
NEIGHBOUR = "neighbour"
"""Another workload of the same priority level. At moments the test chooses it fills every
seat of the level with requests an admission webhook of the test's own holds open: while
they are held, the API server answers each request of our programs 429. A neighbour sending
in bursts hit them only by chance (a CI run saw no 429 reach the operator, whose requests
come in a few short runs), so the moments are chosen instead: the first jail lasts from the
Topics' apply until both programs have been refused, the later ones come and go through
the stream as the other tenants of a busy cluster do."""
FIRST_JAIL_MAX_S = 45
"""The operator is refused at its first patch and each replica at its next Topic table
refresh (3 s): far sooner. Bounded below kopf's own retries of a request (54 s), so that a
jail the programs never meet ends with the check's message, not with kopf giving up."""
JAIL_S, OPEN_S = 1.5, 3.2
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
    program → kubeconfig, ``<program>-schema`` → its FlowSchema's name, ``neighbour`` →
    the neighbour's token, ``namespace``, ``level`` (the priority level) and ``dir`` (for
    the neighbour's files)."""
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
    found.update(namespace=name, level=name, dir=str(tmp_path))
    yield found
    for kind, object_name in reversed(made):
        kubectl.run("delete", kind, object_name, "--ignore-not-found")
    kubectl.run("delete", "namespace", name, "--wait=false")


class HeldAdmission:
    """An HTTPS admission webhook that holds each review it is sent until ``release``, or
    for HOLD_S at most (the API server gives up on a webhook after its timeout, 30 s), and
    then allows it. A request held here holds its seat of its priority level."""

    HOLD_S = 25.0

    def __init__(self, certificate: ServerCertificate) -> None:
        self._open = threading.Event()
        self._lock = threading.Lock()
        self.held = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer._lock:
                    outer.held += 1
                try:
                    outer._open.wait(outer.HOLD_S)
                finally:
                    with outer._lock:
                        outer.held -= 1
                answer = json.dumps(
                    {
                        "apiVersion": "admission.k8s.io/v1",
                        "kind": "AdmissionReview",
                        "response": {"uid": review["request"]["uid"], "allowed": True},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.socket = certificate.server_context().wrap_socket(
            self._server.socket, server_side=True
        )
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self._server.server_address[1]}/hold"

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def close(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()


class Jail:
    """The neighbour: while ``filled``, clients with the neighbour's token create labelled
    ConfigMaps that ``HeldAdmission`` holds, until as many are held as the level has seats.
    A request of our programs then finds the level full: 429, every time."""

    def __init__(self, kube: LocalService, kubectl: Kubectl, throttled: dict[str, str]) -> None:
        self._kubectl = kubectl
        self._namespace = throttled["namespace"]
        self.seats = seats_of(kubectl, throttled["level"])
        ca = make_ca(Path(throttled["dir"]) / "jail-ca", "jail-ca")
        self._admission = HeldAdmission(
            issue_server_certificate(ca, Path(throttled["dir"]) / "jail", "webhook")
        )
        self._webhook = f"{self._namespace}-jail"
        kubectl.apply(held_configmaps(self._webhook, self._namespace, self._admission.url, ca))
        self._client = httpx.Client(
            base_url=kube["KUBE_SERVER"],
            verify=ssl.create_default_context(cafile=kube["KUBE_CA_CERT"]),
            headers={"Authorization": f"Bearer {throttled[NEIGHBOUR]}"},
            timeout=HeldAdmission.HOLD_S + 15,
        )
        self._filling = threading.Event()
        self._stop = threading.Event()
        # One client more than the seats: while the level is full, it is the one refused.
        self._threads = [
            threading.Thread(target=self._occupy, daemon=True) for _ in range(self.seats + 1)
        ]
        for thread in self._threads:
            thread.start()
        self.jails = 0

    def close(self) -> None:
        self._stop.set()
        self._filling.set()
        self._admission.close()
        for thread in self._threads:
            thread.join()
        self._client.close()
        self._kubectl.run("delete", "validatingwebhookconfiguration", self._webhook, check=False)

    @contextlib.contextmanager
    def filled(self) -> Iterator[None]:
        """Every seat of the level held by the neighbour while in the block."""
        self._admission.hold()
        self._filling.set()
        # The API server takes up a new webhook configuration within a moment: until
        # then the neighbour's creations pass at once, and it sends the next.
        deadline = time.monotonic() + 30
        while self._admission.held < self.seats:
            assert time.monotonic() < deadline, (
                f"the neighbour holds {self._admission.held} of the level's {self.seats} seats"
            )
            time.sleep(0.05)
        self.jails += 1
        try:
            yield
        finally:
            self._filling.clear()
            self._admission.release()

    def _occupy(self) -> None:
        path = f"/api/v1/namespaces/{self._namespace}/configmaps"
        body = {"metadata": {"generateName": "held-", "labels": {JAIL_LABEL: "true"}}}
        while not self._stop.is_set():
            if not self._filling.wait(0.5) or self._stop.is_set():
                continue
            try:
                answer = self._client.post(path, json=body)
            except httpx.HTTPError:
                continue
            if answer.status_code == 429:
                self._stop.wait(0.05)  # the level is full: by us, as meant


JAIL_LABEL = "bucketnotify.test/held"


def held_configmaps(
    name: str, namespace: str, url: str, ca: CertificateAuthority
) -> dict[str, Any]:
    """A webhook configuration sending the creation of the neighbour's labelled ConfigMaps
    in ``namespace`` (and nothing else) to ``url``."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "hold.throttling.bucketnotify.test",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Ignore",
                "timeoutSeconds": 30,
                "clientConfig": {
                    "url": url,
                    "caBundle": base64.b64encode(ca.cert.read_bytes()).decode(),
                },
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["configmaps"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "objectSelector": {"matchLabels": {JAIL_LABEL: "true"}},
            }
        ],
    }


def seats_of(kubectl: Kubectl, level: str) -> int:
    """The seats the API server gives the priority level ``level``, from its metrics."""
    for line in kubectl.run("get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith("apiserver_flowcontrol_nominal_limit_seats{") and (
            f'priority_level="{level}"' in line
        ):
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError(f"the API server reports no seats for the priority level {level}")


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


class Weather:
    """The neighbour's jails in a thread of their own: the first from ``start`` until
    ``refused_enough()`` (or FIRST_JAIL_MAX_S), then JAIL_S in every JAIL_S + OPEN_S."""

    def __init__(self, jail: Jail, refused_enough: Callable[[], bool]) -> None:
        self._jail = jail
        self._refused_enough = refused_enough
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.failure: BaseException | None = None

    def __enter__(self) -> Weather:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            with self._jail.filled():
                deadline = time.monotonic() + FIRST_JAIL_MAX_S
                while time.monotonic() < deadline and not self._stop.is_set():
                    if self._refused_enough():
                        break
                    self._stop.wait(0.5)
            while not self._stop.wait(OPEN_S):
                with self._jail.filled():
                    self._stop.wait(JAIL_S)
        except BaseException as exc:  # seen by the test, not lost in a thread
            self.failure = exc


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

    def refused() -> dict[str, float]:
        return {p: rejected(kubectl, s) - before[p] for p, s in schemas.items()}

    jail = Jail(kube, kubectl, throttled)
    pipeline = Pipeline(kube, rgw, replicas=2, kubeconfigs={p: throttled[p] for p in PROGRAMS})
    try:
        with (
            RecordingHttpServer() as receiver,
            Weather(jail, lambda: all(refused().values())) as weather,
        ):
            target = HttpTarget(receiver)
            # Every Topic and BucketNotification Ready: slower than unthrottled (the first
            # jail holds their status back, kopf backs off after each 429), so waited for
            # longer; Ready is what counts.
            buckets = pipeline.topics(target, ready_within=READY_WITHIN_S)
            with Stream(rgw, list(buckets.values()), PER_SECOND) as stream:
                time.sleep(STREAM_S)
            outcomes = settle(stream, target, buckets, 240)
        answered_429 = refused()
        logs = {"operator": pipeline.operator.log() if pipeline.operator else ""}
        logs.update({name: r.log() for name, r in pipeline.cluster.replicas.items()})
    finally:
        pipeline.close()
        jail.close()
    print(f"answered 429: {answered_429}; the neighbour filled the level {jail.jails} times")
    assert weather.failure is None, f"the neighbour could not fill the level: {weather.failure}"
    assert all(answered_429.values()), (
        f"the API server refused none of a program's requests: {answered_429}"
    )
    for outcome in outcomes:
        assert outcome.acked > 0, outcome.line()
        assert not outcome.lost, outcome.line()
        assert outcome.duplicates == 0, outcome.line()
    for program, log in logs.items():
        bad = troubles(log)
        assert not bad, f"{program} logged an error or a traceback:\n" + "\n".join(bad[:10])
