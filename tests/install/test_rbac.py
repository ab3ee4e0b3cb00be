"""The chart's RBAC is enough, and its rules are used: the operator and the delivery service
run as local processes with the credentials of the chart's own ServiceAccounts (TokenRequest
tokens, RBAC on), configured by the very environment the chart's Deployments give them, and
reconcile the samples of deploy/samples; an event uploaded to the gateway arrives.

Minimal: every verb a rule grants is used by a named feature. The apiserver's audit log
(deploy/local/kube.sh logs every ServiceAccount request) shows each grant exercised by a
successful request during that run, and no grant comes from two rules: so removing any one
rule forbids a request a feature made. Two rules removed one at a time show what that looks
like: the feature that needs them breaks with the apiserver's refusal in the log.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from devstack.servers.recording import HttpReceiver
from tests.claims import Provisioner, install_claim_crd
from tests.delivery import wait_ready
from tests.install.manifests import SAMPLES, Obj, apply, kustomize, template
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.processes import Program, free_port
from tests.s3 import connection, s3_client
from tests.serviceaccounts import token_kubeconfig
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")


@dataclass
class Release:
    """The chart rendered and applied as ``name`` in ``namespace``, serving that namespace."""

    name: str
    namespace: str
    objects: list[Obj]
    kubectl: Kubectl
    kube: LocalService
    workdir: Path
    ingest_port: int
    programs: list[Program] = field(default_factory=list)

    def deployment(self, component: str) -> Obj:
        (found,) = [
            o
            for o in self.objects
            if o["kind"] == "Deployment" and o["metadata"]["name"] == f"{self.name}-{component}"
        ]
        return found

    def kubeconfig_for(self, service_account: str) -> str:
        """A kubeconfig with a TokenRequest token of ``service_account``: its rights only."""
        return token_kubeconfig(
            self.kube, self.kubectl, self.namespace, service_account, self.workdir
        )

    def env(self, component: str) -> dict[str, str]:
        """The container's environment as the kubelet would build it for a pod of ours."""
        pod_spec = self.deployment(component)["spec"]["template"]["spec"]
        (container,) = pod_spec["containers"]
        env: dict[str, str] = {}
        for entry in container["env"]:
            value = _resolve(entry, env, self, f"{self.name}-{component}-0")
            if value is not None:
                env[entry["name"]] = value
        env["KUBECONFIG"] = self.kubeconfig_for(pod_spec["serviceAccountName"])
        return env

    def start(self, component: str, wait: bool = True, **overrides: str) -> Program:
        env = self.env(component)
        if component == "delivery":
            # A pod listens on all its addresses; here nothing but loopback is ours.
            env["BUCKETNOTIFY_DELIVERY_LISTEN_HOST"] = "127.0.0.1"
        program = Program([component], {**env, **overrides})
        self.programs.append(program)
        if component == "delivery" and wait:
            # Ready only once it has read the Topics with the chart's RBAC.
            wait_ready(self.ingest_port, program, START_TIMEOUT_S)
        return program


# The machine is shared and often loaded: start-up and reconciliation get generous time.
START_TIMEOUT_S = 180
READY_TIMEOUT_S = 180


def ready(kubectl: Kubectl, namespace: str, kind: str, name: str) -> None:
    def conditions() -> dict[str, str]:
        status = kubectl.get(kind, name, namespace).get("status") or {}
        return {c["type"]: c["status"] for c in status.get("conditions", [])}

    wait_until(conditions, lambda c: c.get("Ready") == "True", READY_TIMEOUT_S, f"{kind} {name}")


def _resolve(entry: dict[str, Any], env: dict[str, str], release: Release, pod: str) -> str | None:
    if "value" in entry:
        # $(VAR) refers to a variable defined earlier in the list, as in Kubernetes.
        return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], str(entry["value"]))
    source = entry["valueFrom"]
    if "fieldRef" in source:
        path = source["fieldRef"]["fieldPath"]
        # The programs run on this machine's loopback: that is their pod IP here.
        fields = {
            "metadata.namespace": release.namespace,
            "metadata.name": pod,
            "status.podIP": "127.0.0.1",
        }
        return fields[path]
    ref = source["secretKeyRef"]
    secret = release.kubectl.get("secret", ref["name"], release.namespace)
    data = secret.get("data") or {}
    if ref["key"] not in data:
        assert ref.get("optional"), f"Secret {ref['name']} lacks {ref['key']}"
        return None
    return base64.b64decode(data[ref["key"]]).decode()


MakeRelease = Callable[..., Release]


@pytest.fixture()
def make_release(
    helm_bin: str,
    kubectl: Kubectl,
    kube: LocalService,
    rgw: LocalService,
    namespace: str,
    tmp_path: Path,
) -> Iterator[MakeRelease]:
    releases: list[Release] = []

    def make(edit: Callable[[list[Obj]], None] | None = None) -> Release:
        name = f"bucketnotify-{uuid.uuid4().hex[:8]}"
        ingest_port = free_port()
        objs = template(
            helm_bin,
            release=name,
            namespace=namespace,
            sets=[
                f"watchNamespaces={json.dumps([namespace])}",
                f"delivery.port={ingest_port}",
                f'delivery.ingestURL="http://127.0.0.1:{ingest_port}"',
                f'delivery.store.bucket="bnq-{uuid.uuid4().hex[:12]}"',
                f"operator.metricsPort={free_port()}",
                # The programs run here as host processes, which the API server cannot reach
                # through a Service: tests/integration/test_admission_webhook.py serves the
                # webhook to it on loopback instead.
                "webhook.enabled=false",
            ],
        )
        if edit is not None:
            edit(objs)
        # The gateway Secret the chart's pods read, as an administrator would create it.
        kubectl.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "bucketnotify-gateway", "namespace": namespace},
                "stringData": {
                    "endpoint": rgw["RGW_ENDPOINT"],
                    "accessKey": rgw["RGW_ACCESS_KEY"],
                    "secretKey": rgw["RGW_SECRET_KEY"],
                    "region": rgw["RGW_REGION"] or "default",
                },
            }
        )
        apply(kubectl, objs, namespace)
        release = Release(name, namespace, objs, kubectl, kube, tmp_path, ingest_port)
        releases.append(release)
        return release

    yield make
    for release in releases:
        for program in release.programs:
            program.stop()
        for program in release.programs:
            print(f"--- {program.log_path} ---\n{program.log()[-5000:]}")


def samples(
    kubectl: Kubectl, namespace: str, receiver_url: str, bucket: str, suffix: str
) -> list[Obj]:
    """deploy/samples as a user would apply them, pointed at this test's endpoint and bucket.
    Gateway topic names (spec.name) get a suffix: the gateway's topics are per tenant, shared
    by every namespace and every earlier test."""
    objs = kustomize(kubectl.binary, SAMPLES)
    for obj in objs:
        spec = obj.get("spec", {})
        if obj["kind"] == "Topic":
            spec["name"] = f"{obj['metadata']['name']}-{suffix}"
            if "http" in spec["endpoint"]:
                spec["endpoint"]["http"]["url"] = receiver_url
        if obj["kind"] == "BucketNotification":
            spec["bucket"] = bucket
        obj["metadata"]["namespace"] = namespace
    return objs


def forbidden_lines(program: Program) -> list[str]:
    """Log lines of an apiserver refusal (an ApiError "403 Forbidden" or the apiserver's
    message "... is forbidden: ...", kopf's "Not enough permissions"); a bare 403 would
    match timestamps and uids."""
    refusal = re.compile(r"forbidden|\(403\)|not enough permissions", re.IGNORECASE)
    return [line for line in program.log().splitlines() if refusal.search(line)]


Grant = tuple[str, str, str, str]
"""(component, API group, resource[/subresource], verb)"""

FEATURES: dict[Grant, str] = {
    ("operator", "bucketnotify.io", "topics", "get"): "a BucketNotification reads its Topic",
    ("operator", "bucketnotify.io", "topics", "list"): "watching Topics",
    ("operator", "bucketnotify.io", "topics", "watch"): "watching Topics",
    ("operator", "bucketnotify.io", "topics", "patch"): "Topic finalizer and kopf progress",
    ("operator", "bucketnotify.io", "bucketnotifications", "list"): "watching notifications",
    ("operator", "bucketnotify.io", "bucketnotifications", "watch"): "watching notifications",
    ("operator", "bucketnotify.io", "bucketnotifications", "patch"): "notification finalizer",
    ("operator", "bucketnotify.io", "topics/status", "patch"): "Topic conditions",
    (
        "operator",
        "bucketnotify.io",
        "bucketnotifications/status",
        "patch",
    ): "notification conditions",
    ("operator", "", "secrets", "get"): "gateway, broker and ingest-token Secrets",
    ("operator", "", "secrets", "list"): "re-sync when a referenced Secret changes",
    ("operator", "", "secrets", "watch"): "re-sync when a referenced Secret changes",
    ("operator", "", "secrets", "create"): "the ingest token of a persistent Topic",
    ("operator", "", "secrets", "patch"): "the watched label on the Secrets Topics use",
    ("operator", "", "events", "create"): "Events on Topics and notifications",
    ("operator", "", "events", "patch"): "the count of a repeated Event (Updated twice)",
    ("operator", "objectbucket.io", "objectbucketclaims", "get"): "a bucketRef's claim",
    ("operator", "", "configmaps", "get"): "a bucketRef's claim's ConfigMap (bucket, gateway)",
    ("operator", "apiextensions.k8s.io", "customresourcedefinitions", "list"): "kopf discovery",
    ("operator", "apiextensions.k8s.io", "customresourcedefinitions", "watch"): "kopf discovery",
    ("operator", "", "namespaces", "list"): "watchNamespaces",
    ("operator", "", "namespaces", "watch"): "watchNamespaces",
    ("operator", "", "namespaces", "get"): "the owner mark of gateway topics",
    ("operator", "coordination.k8s.io", "leases", "create"): "leader election",
    ("operator", "coordination.k8s.io", "leases", "get"): "leader election",
    ("operator", "coordination.k8s.io", "leases", "update"): "leader election",
    ("delivery", "bucketnotify.io", "topics", "get"): "looking up the Topic of an event",
    ("delivery", "bucketnotify.io", "topics", "list"): "the Topic watch's list",
    ("delivery", "bucketnotify.io", "topics", "watch"): "the Topic watch",
    ("delivery", "", "secrets", "get"): "ingest tokens and broker credentials",
    ("delivery", "", "secrets", "list"): "the Secrets of several Topics read again at once",
    ("delivery", "", "configmaps", "get"): "the CA bundle of a caRef",
    ("delivery", "", "configmaps", "create"): "its health report, first written",
    ("delivery", "", "configmaps", "update"): "its health report, written again",
    ("delivery", "", "configmaps", "list"): "finding the reports of replicas gone",
    ("delivery", "", "configmaps", "delete"): "its health report, at a graceful stop",
    ("operator", "", "configmaps", "list"): "the replicas' health reports (status.delivery)",
    ("delivery", "", "events", "create"): "EndpointFailing and the other Events",
    ("delivery", "", "events", "patch"): "the count of a repeating Event",
    ("delivery", "coordination.k8s.io", "leases", "get"): "queue-shard ownership",
    ("delivery", "coordination.k8s.io", "leases", "list"): "queue-shard ownership",
    ("delivery", "coordination.k8s.io", "leases", "create"): "queue-shard ownership",
    ("delivery", "coordination.k8s.io", "leases", "update"): "queue-shard ownership",
    ("delivery", "coordination.k8s.io", "leases", "delete"): "no member Lease left behind",
    ("operator", "apps", "deployments", "get"): "the leader Lease owned by its Deployment",
    ("delivery", "apps", "deployments", "get"): "the Leases owned by their Deployment",
}
"""Every grant of the chart and the feature that uses it."""


def chart_grants(release: Release) -> list[Grant]:
    """Every grant the release's Roles and ClusterRoles give our two components, once per
    rule that gives it."""
    component_of = {
        release.deployment(c)["spec"]["template"]["spec"]["serviceAccountName"]: c
        for c in ("operator", "delivery")
    }
    bound: dict[tuple[str, str], list[str]] = {}
    for obj in release.objects:
        if obj["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            ref = obj["roleRef"]
            for subject in obj["subjects"]:
                bound.setdefault((ref["kind"], ref["name"]), []).append(
                    component_of[subject["name"]]
                )
    grants = []
    for obj in release.objects:
        if obj["kind"] not in ("Role", "ClusterRole"):
            continue
        for component in bound.get((obj["kind"], obj["metadata"]["name"]), []):
            for rule in obj["rules"]:
                grants += [
                    (component, group, resource, verb)
                    for group in rule["apiGroups"]
                    for resource in rule["resources"]
                    for verb in rule["verbs"]
                ]
    return grants


def audited_grants(kube: LocalService, release: Release) -> set[Grant]:
    """What the release's ServiceAccounts did successfully, from the apiserver's audit log."""
    component_of = {
        f"system:serviceaccount:{release.namespace}:"
        + release.deployment(c)["spec"]["template"]["spec"]["serviceAccountName"]: c
        for c in ("operator", "delivery")
    }
    used: set[Grant] = set()
    log = Path(kube["KUBE_AUDIT_LOG"])
    for line in log.read_text().splitlines() if log.exists() else []:
        event = json.loads(line)
        component = component_of.get(event["user"]["username"])
        ref = event.get("objectRef")
        if component is None or ref is None or event["responseStatus"]["code"] >= 400:
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        used.add((component, ref.get("apiGroup", ""), resource, event["verb"]))
    return used


def operator_secret_reads(kube: LocalService, release: Release) -> set[str]:
    """The label selectors of the operator's Secret lists and watches, from the audit log."""
    account = release.deployment("operator")["spec"]["template"]["spec"]["serviceAccountName"]
    username = f"system:serviceaccount:{release.namespace}:{account}"
    selectors = set()
    for line in Path(kube["KUBE_AUDIT_LOG"]).read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        if (
            event["user"]["username"] == username
            and ref.get("resource") == "secrets"
            and event["verb"] in ("list", "watch")
        ):
            query = parse_qs(urlsplit(event["requestURI"]).query)
            selectors.add(f"labelSelector={','.join(query.get('labelSelector', []))}")
    return selectors


def failing_topic_with_a_ca(
    kubectl: Kubectl, kube: LocalService, namespace: str, suffix: str, bucket: str
) -> list[Obj]:
    """A persistent Topic whose https endpoint trusts a CA bundle of a ConfigMap and never
    answers: its events read the bundle and keep failing (an Event, then its count)."""
    ca = Path(kube["KUBE_CA_CERT"]).read_text()
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "endpoint-ca", "namespace": namespace},
            "data": {"ca.crt": ca},
        },
        {
            "apiVersion": "bucketnotify.io/v1alpha1",
            "kind": "Topic",
            "metadata": {"name": "unreachable", "namespace": namespace},
            "spec": {
                "name": f"unreachable-{suffix}",
                "endpoint": {
                    "http": {
                        "url": f"https://127.0.0.1:{free_port()}/",
                        "caRef": {"name": "endpoint-ca"},
                    }
                },
                "persistent": True,
                "delivery": {"handoff": "sync"},
            },
        },
        {
            "apiVersion": "bucketnotify.io/v1alpha1",
            "kind": "BucketNotification",
            "metadata": {"name": "unreachable", "namespace": namespace},
            "spec": {
                "bucket": bucket,
                "topicRef": {"name": "unreachable"},
                "testEvent": False,
                "events": ["s3:ObjectCreated:Put"],
            },
        },
    ]


def test_samples_reconcile_and_deliver_under_the_chart_rbac_and_use_every_rule(
    make_release: MakeRelease,
    kubectl: Kubectl,
    namespace: str,
    rgw: LocalService,
    kube: LocalService,
) -> None:
    """Every sample Topic (http, amqp, kafka; persistent, so the operator makes their ingest
    token Secrets) and BucketNotification (every filter kind) becomes Ready, an uploaded
    object's event reaches the HTTP endpoint through the delivery service, and neither
    program met a refusal of the apiserver on the way. With a Topic whose endpoint fails,
    that run uses every grant of the chart."""
    release = make_release()
    grants = chart_grants(release)
    assert sorted(set(grants)) == sorted(FEATURES), "a grant without a feature, or the reverse"
    repeated = {g for g in grants if grants.count(g) > 1}
    assert not repeated, f"given by two rules, so removing one changes nothing: {repeated}"
    operator = release.start("operator")
    delivery = release.start("delivery")
    suffix = uuid.uuid4().hex[:8]
    bucket = f"inst-{suffix}"
    s3 = s3_client(rgw)
    s3.create_bucket(Bucket=bucket)
    failing_bucket = f"fail-{suffix}"
    s3.create_bucket(Bucket=failing_bucket)
    failing = failing_topic_with_a_ca(kubectl, kube, namespace, suffix, failing_bucket)
    apply(kubectl, failing, namespace)
    ready(kubectl, namespace, "bucketnotification", "unreachable")
    s3.put_object(Bucket=failing_bucket, Key="never-delivered", Body=b"x")
    with HttpReceiver() as receiver:
        objs = samples(kubectl, namespace, receiver.url, bucket, suffix)
        apply(kubectl, objs, namespace)
        for obj in objs:
            if obj["kind"] in ("Topic", "BucketNotification"):
                ready(kubectl, namespace, obj["kind"].lower(), obj["metadata"]["name"])
        s3.put_object(Bucket=bucket, Key="images/cat.jpg", Body=b"meow")
        records = receiver.next_records(timeout=READY_TIMEOUT_S)
    # A notification on the bucket of an ObjectBucketClaim, as Rook's provisioner binds it.
    install_claim_crd(kubectl)
    claims = Provisioner(kubectl, namespace, rgw, connection(rgw, other=True).s3())
    claims.claim("photos")
    claims.bind("photos")
    kubectl.apply(
        {
            "apiVersion": "bucketnotify.io/v1alpha1",
            "kind": "BucketNotification",
            "metadata": {"name": "claimed", "namespace": namespace},
            "spec": {
                "bucketRef": {"objectBucketClaim": "photos"},
                "topicRef": {"name": "webhook"},
                "testEvent": False,
            },
        }
    )
    ready(kubectl, namespace, "bucketnotification", "claimed")
    assert [r["s3"]["object"]["key"] for r in records] == ["images/cat.jpg"]
    assert records[0]["s3"]["configurationId"] == "uploads-images"
    # The delivery service opened its Leases in the release namespace under its own name.
    leases = kubectl.run("get", "leases", "-n", namespace, "-o", "json").stdout
    assert f"{release.name}-delivery-0" in leases
    # The operator's Events on the Topics were let through (create events).
    events = json.loads(kubectl.run("get", "events", "-n", namespace, "-o", "json").stdout)
    noted = {
        e["involvedObject"]["name"]
        for e in events["items"]
        if e["involvedObject"]["kind"] == "Topic" and e["type"] == "Normal"
    }
    assert noted == {"webhook", "orders-amqp", "audit-kafka", "unreachable"}
    # A Topic edited twice is Updated twice: one Event, its count patched (as the failing
    # Topic's delivery Event: created at once, its count patched up to 30 s later).
    for opaque in ("first", "second"):
        kubectl.run(
            "patch",
            "topic",
            "webhook",
            "-n",
            namespace,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"opaqueData": opaque}}),
        )
        wait_until(
            lambda: kubectl.get("topic", "webhook", namespace),
            lambda obj: (
                obj.get("status", {}).get("observedGeneration") == obj["metadata"]["generation"]
            ),
            READY_TIMEOUT_S,
            "the edited Topic synced",
        )
    # Every Lease names its component's Deployment as owner: deleting it (helm uninstall)
    # takes them along.
    leases = json.loads(kubectl.run("get", "leases", "-n", namespace, "-o", "json").stdout)
    for lease in leases["items"]:
        component = (
            "operator" if lease["metadata"]["name"] == "bucketnotify-operator" else "delivery"
        )
        deployment = kubectl.get("deployment", f"{release.name}-{component}", namespace)
        assert lease["metadata"].get("ownerReferences") == [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": f"{release.name}-{component}",
                "uid": deployment["metadata"]["uid"],
            }
        ], lease["metadata"]
    # A replica that stops (a pod rolled away) deletes its member Lease.
    delivery.stop()
    assert delivery.process.returncode == 0, delivery.log()[-3000:]
    leases = json.loads(kubectl.run("get", "leases", "-n", namespace, "-o", "json").stdout)
    members = [
        lease["metadata"]["name"]
        for lease in leases["items"]
        if lease["metadata"].get("labels", {}).get("bucketnotify.io/lease-role") == "member"
    ]
    assert members == []
    unused = wait_until(
        lambda: {g: FEATURES[g] for g in set(FEATURES) - audited_grants(kube, release)},
        lambda missing: not missing,
        READY_TIMEOUT_S,
        "every grant of the chart used by a successful request",
    )
    assert not unused
    # The operator's Secret listing and watch asked for its labelled Secrets only, and the
    # broker credentials of the AMQP sample (made without the label) got it.
    assert operator_secret_reads(kube, release) == {"labelSelector=bucketnotify.io/watched=true"}
    credentials = kubectl.get("secret", "amqp-credentials", namespace)
    assert credentials["metadata"]["labels"]["bucketnotify.io/watched"] == "true"
    assert operator.process.poll() is None, operator.log()[-3000:]
    for program in (operator, delivery):
        assert not forbidden_lines(program), forbidden_lines(program)


def _drop_verb(objs: list[Obj], role_suffix: str, resource: str, verb: str) -> None:
    for obj in objs:
        if obj["kind"] == "Role" and obj["metadata"]["name"].endswith(role_suffix):
            for rule in obj["rules"]:
                if resource in rule["resources"] and verb in rule["verbs"]:
                    rule["verbs"].remove(verb)
                    return
    raise AssertionError(f"no rule grants {verb} {resource} in *{role_suffix}")


def test_without_secret_create_a_persistent_topic_gets_no_ingest(
    make_release: MakeRelease, kubectl: Kubectl, namespace: str
) -> None:
    """The rule `create secrets` is what gives a persistent Topic its ingest token: without
    it the apiserver refuses the operator and the Topic never becomes Ready."""
    release = make_release(lambda objs: _drop_verb(objs, "-operator", "secrets", "create"))
    operator = release.start("operator")
    topic = {
        "apiVersion": "bucketnotify.io/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": "hook", "namespace": namespace},
        "spec": {
            "name": f"hook-{uuid.uuid4().hex[:8]}",
            "endpoint": {"http": {"url": "http://127.0.0.1:9/"}},
            "persistent": True,
        },
    }
    kubectl.apply(topic)
    refusals = wait_until(
        lambda: [line for line in forbidden_lines(operator) if "secrets" in line],
        bool,
        READY_TIMEOUT_S,
        "the operator's refused Secret create",
    )
    # The log line is JSON around the apiserver's JSON answer: quotes come escaped twice.
    assert re.search(r'cannot create resource [\\"]*secrets', refusals[0]), refusals
    ready = {
        c["type"]: c["status"]
        for c in (kubectl.get("topic", "hook", namespace).get("status") or {}).get("conditions", [])
    }
    assert ready.get("Ready") != "True"


def test_without_lease_create_the_delivery_service_owns_no_shard(
    make_release: MakeRelease, kubectl: Kubectl, namespace: str
) -> None:
    """The rule `create leases` of the delivery Role is what lets a replica take queue
    shards: without it the apiserver refuses the Lease and the replica owns nothing; it
    says so in one line (not a traceback) and exits 1."""
    release = make_release(lambda objs: _drop_verb(objs, "-delivery-leases", "leases", "create"))
    delivery = release.start("delivery", wait=False)
    refusals = wait_until(
        lambda: [line for line in forbidden_lines(delivery) if "leases" in line],
        bool,
        READY_TIMEOUT_S,
        "the delivery service's refused Lease create",
    )
    assert re.search(r'cannot create resource [\\"]*leases', refusals[0]), refusals
    assert delivery.process.wait(timeout=60) == 1, delivery.log()[-3000:]
    assert "Traceback" not in delivery.log(), delivery.log()[-3000:]
    assert "check the ServiceAccount's credentials and RBAC" in delivery.log()
    leases = json.loads(kubectl.run("get", "leases", "-n", namespace, "-o", "json").stdout)
    holders = {(lease["spec"] or {}).get("holderIdentity") for lease in leases["items"]}
    assert f"{release.name}-delivery-0" not in holders
