"""The chart's RBAC is enough, and its rules are used: the operator and the delivery service
run as local processes with the credentials of the chart's own ServiceAccounts (TokenRequest
tokens, RBAC on), configured by the very environment the chart's Deployments give them, and
reconcile the samples of deploy/samples; an event uploaded to the gateway arrives. Two rules
removed one at a time each break the feature that needs them.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.delivery import free_port
from tests.install.manifests import SAMPLES, Obj, kustomize, template
from tests.install.test_manifests import apply
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.processes import Program
from tests.receivers import HttpReceiver
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
        token = self.kubectl.run(
            "create", "token", service_account, "-n", self.namespace, "--duration=2h"
        ).stdout.strip()
        path = self.workdir / f"{service_account}.kubeconfig"
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "local",
                            "cluster": {
                                "server": self.kube["KUBE_SERVER"],
                                "certificate-authority": self.kube["KUBE_CA_CERT"],
                            },
                        }
                    ],
                    "users": [{"name": service_account, "user": {"token": token}}],
                    "contexts": [
                        {
                            "name": "sa",
                            "context": {
                                "cluster": "local",
                                "user": service_account,
                                "namespace": self.namespace,
                            },
                        }
                    ],
                    "current-context": "sa",
                }
            )
        )
        return str(path)

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
            _wait_listening(self.ingest_port, program)
        return program


# The machine is shared and often loaded: start-up and reconciliation get generous time.
START_TIMEOUT_S = 180
READY_TIMEOUT_S = 180


def _wait_listening(port: int, program: Program) -> None:
    def listening() -> bool:
        if program.process.poll() is not None:
            pytest.fail(f"{program.log_path} exited:\n{program.log()[-3000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return True
        return False

    wait_until(listening, bool, START_TIMEOUT_S, f"the delivery service listening on {port}")


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
        return {"metadata.namespace": release.namespace, "metadata.name": pod}[path]
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
    """Log lines of an apiserver refusal (ApiException "(403)\\nReason: Forbidden", kopf's
    "Not enough permissions"); a bare 403 would match timestamps and uids."""
    refusal = re.compile(r"forbidden|\(403\)|not enough permissions", re.IGNORECASE)
    return [line for line in program.log().splitlines() if refusal.search(line)]


def s3_client(rgw: LocalService) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=rgw["RGW_ENDPOINT"],
        aws_access_key_id=rgw["RGW_ACCESS_KEY"],
        aws_secret_access_key=rgw["RGW_SECRET_KEY"],
        region_name=rgw["RGW_REGION"] or "default",
    )


def test_samples_reconcile_and_deliver_under_the_chart_rbac(
    make_release: MakeRelease, kubectl: Kubectl, namespace: str, rgw: LocalService
) -> None:
    """Every sample Topic (http, amqp, kafka; persistent, so the operator makes their ingest
    token Secrets) and BucketNotification (every filter kind) becomes Ready, an uploaded
    object's event reaches the HTTP endpoint through the delivery service, and neither
    program met a refusal of the apiserver on the way."""
    release = make_release()
    operator = release.start("operator")
    delivery = release.start("delivery")
    suffix = uuid.uuid4().hex[:8]
    bucket = f"inst-{suffix}"
    s3 = s3_client(rgw)
    s3.create_bucket(Bucket=bucket)
    with HttpReceiver() as receiver:
        objs = samples(kubectl, namespace, receiver.url, bucket, suffix)
        apply(kubectl, objs, namespace)
        for obj in objs:
            if obj["kind"] in ("Topic", "BucketNotification"):
                ready(kubectl, namespace, obj["kind"].lower(), obj["metadata"]["name"])
        s3.put_object(Bucket=bucket, Key="images/cat.jpg", Body=b"meow")
        records = receiver.next_records(timeout=READY_TIMEOUT_S)
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
    assert noted == {"webhook", "orders-amqp", "audit-kafka"}
    for program in (operator, delivery):
        assert program.process.poll() is None, program.log()[-3000:]
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
