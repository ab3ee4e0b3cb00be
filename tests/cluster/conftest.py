"""Fixtures of the cluster tier: a real one-node cluster (deploy/local/node.sh: kubelet,
containerd, kube-proxy, controller-manager and scheduler), our image built and imported
into it (deploy/local/images.sh), and the chart installed with helm as a user would.

The gateway runs on the host, as an RGW outside the cluster would: pods reach it through a
forwarder on the cluster bridge (they cannot reach the host's loopback), and it reaches the
ingest through the delivery Service's ClusterIP, which kube-proxy serves on the host too.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.servers.recording import RecordingHttpServer
from devstack.servers.tcpproxy import TcpProxy
from tests.cluster.pods import (
    Release,
    Upgrade,
    describe,
    describe_all,
    ready_since,
    release_pods,
)
from tests.cluster.uploads import Uploads, notified_bucket
from tests.install.manifests import CHART, PREVIOUS_RELEASE, helm
from tests.kubectl import Kubectl
from tests.localservices import LOCAL, LocalService, start, stop

# helm --wait: five pods start at once on two cores, each importing kopf or aiohttp.
INSTALL_TIMEOUT = "6m"


@pytest.fixture(scope="session")
def node() -> Iterator[LocalService]:
    """The one-node cluster; ``NODE_KUBECONFIG``, ``NODE_ADDRESS`` (the bridge: the host's
    address that pods reach), ``KUBECTL``."""
    service = start("node")
    try:
        yield service
    finally:
        stop(service)


@pytest.fixture(scope="session")
def image(node: LocalService) -> str:
    """Our operator/delivery image, built from the Dockerfile and imported into the node's
    containerd (no registry: pods use it with imagePullPolicy Never)."""
    return run_script("images.sh", "all")


def run_script(*args: str) -> str:
    """A deploy/local script's last line of stdout; its log tail as the failure."""
    result = subprocess.run(
        ["bash", str(LOCAL / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-60:])
        pytest.fail(f"deploy/local/{' '.join(args)} failed:\n{tail}", pytrace=False)
    print(result.stderr[-2000:])
    return result.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def spark_image(node: LocalService) -> str:
    """Java, Spark, hadoop-aws, the report job and the Spark operator's controller in one
    image (the Dockerfile's report target plus the operator built from its Go module),
    imported into the node."""
    return run_script("images.sh", "spark")


@pytest.fixture(scope="module")
def spark_operator(
    helm_bin: str, spark_image: str, node: LocalService, ckubectl: Kubectl, release: Release
) -> Iterator[str]:
    """The Kubeflow Spark operator installed from its own Helm chart (controller and mutating
    webhook, which puts the gateway Secret's keys into the driver and executor pods) with our
    image, watching the release's namespace. Its own namespace."""
    chart = Path(run_script("spark-operator-build.sh")) / "chart"
    suffix = uuid.uuid4().hex[:6]
    name, namespace = f"spark-operator-{suffix}", f"spark-operator-{suffix}"
    registry, _, rest = spark_image.partition("/")
    repository, _, tag = rest.rpartition(":")
    values = [
        f"image.registry={registry}",
        f"image.repository={repository}",
        f"image.tag={tag}",
        "image.pullPolicy=Never",
        f"spark.jobNamespaces={{{release.namespace}}}",
        # The job brings its own ServiceAccount and Role (deploy/spark/rbac.yaml).
        "spark.serviceAccount.create=false",
        "spark.rbac.create=false",
    ]
    try:
        helm(
            helm_bin, "install", name, str(chart), "-n", namespace, "--create-namespace",
            "--kubeconfig", node["NODE_KUBECONFIG"], "--wait", "--timeout", INSTALL_TIMEOUT,
            *[arg for value in values for arg in ("--set", value)],
        )  # fmt: skip
    except AssertionError as exc:
        pytest.fail(f"{exc}\n{describe_all(ckubectl, namespace)}", pytrace=False)
    yield namespace
    print(describe_all(ckubectl, namespace)[-4000:])
    helm(
        helm_bin, "uninstall", name, "-n", namespace, "--kubeconfig", node["NODE_KUBECONFIG"],
        "--wait", check=False,
    )  # fmt: skip
    ckubectl.run("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture(scope="session")
def ckubectl(node: LocalService) -> Kubectl:
    """kubectl as the admin of the one-node cluster."""
    return Kubectl(node["KUBECTL"], node["NODE_KUBECONFIG"])


@pytest.fixture(scope="session")
def gateway_for_pods(node: LocalService, rgw: LocalService) -> Iterator[TcpProxy]:
    """The gateway at an address pods reach: a forwarder on the bridge to its loopback port."""
    host, _, port = rgw["RGW_ENDPOINT"].removeprefix("http://").partition(":")
    proxy = TcpProxy(host, int(port), listen_host=node["NODE_ADDRESS"])
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def receiver(node: LocalService) -> Iterator[RecordingHttpServer]:
    """The HTTP endpoint, on the bridge where the delivery pods reach it."""
    with RecordingHttpServer(host=node["NODE_ADDRESS"]) as server:
        yield server


@pytest.fixture(scope="module")
def release(
    helm_bin: str,
    image: str,
    node: LocalService,
    ckubectl: Kubectl,
    rgw: LocalService,
    gateway_for_pods: TcpProxy,
    receiver: RecordingHttpServer,
) -> Iterator[Release]:
    """The previous release's chart and image (``PREVIOUS_RELEASE``) installed with `helm
    install --wait` into a fresh namespace, upgraded with the ingest URL the host-side
    gateway can use (the Service's ClusterIP, known only once installed), then upgraded to
    our chart and image as a user would, while uploads to a Topic with hand-off sync go on
    (``Release.upgrade``; the first test checks them). Each upgrade rolls the pods, which
    must come back Ready."""
    previous, previous_tree = run_script("images.sh", "release", PREVIOUS_RELEASE).split()
    suffix = uuid.uuid4().hex[:6]
    # Unique: the chart's ClusterRoles are cluster-wide and named after the release.
    name, namespace = f"bn{suffix}", f"bn-{suffix}"
    # Scoped to 20 namespaces, as a platform team with a namespace per tenant team runs it:
    # the release's own, the one a test deletes whole, and 18 more. The chart puts a Role in
    # each, so they exist before the install.
    watched = [namespace, f"{namespace}-apps"] + [f"{namespace}-t{i:02d}" for i in range(2, 20)]
    for ns in watched:
        ckubectl.run("create", "namespace", ns)
    repository, _, tag = previous.rpartition(":")
    values = [
        f"watchNamespaces={{{','.join(watched)}}}",
        f"image.repository={repository}",
        f"image.tag={tag}",
        "image.pullPolicy=Never",
        "gateway.create=true",
        f"gateway.endpoint={gateway_for_pods.url}",
        f"gateway.accessKey={rgw['RGW_ACCESS_KEY']}",
        f"gateway.secretKey={rgw['RGW_SECRET_KEY']}",
        # Its own queue-store bucket and owner mark: other tests use the same gateway.
        f"delivery.store.bucket=bn-queues-{suffix}",
        f"operator.ownerId=cluster-{suffix}",
        # One node: the chart's anti-affinity is soft, so all replicas land on it.
        "delivery.preStopSleepSeconds=2",
    ]
    sets = [arg for value in values for arg in ("--set", value)]
    # CRDs an earlier run's release kept (crds.keep) carry that release's name, and helm
    # adopts them only into a release of that name: hand them over as the README says.
    for crd in ("topics.bucketnotify.io", "bucketnotifications.bucketnotify.io"):
        if ckubectl.run("get", "crd", crd, check=False).returncode == 0:
            ckubectl.run(
                "annotate", "crd", crd, f"meta.helm.sh/release-name={name}",
                f"meta.helm.sh/release-namespace={namespace}", "--overwrite",
            )  # fmt: skip
    previous_chart = str(Path(previous_tree) / "charts" / "bucketnotify")
    started = time.monotonic()
    try:
        helm(
            helm_bin,
            "install",
            name,
            previous_chart,
            "-n",
            namespace,
            "--kubeconfig",
            node["NODE_KUBECONFIG"],
            "--wait",
            "--timeout",
            INSTALL_TIMEOUT,
            *sets,
        )
    except AssertionError as exc:
        pytest.fail(f"{exc}\n{describe(ckubectl, namespace)}", pytrace=False)
    installed = time.monotonic() - started
    service = json.loads(
        ckubectl.run(
            "get", "service", f"{name}-bucketnotify-delivery", "-n", namespace, "-o", "json"
        ).stdout
    )
    ingest_url = f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"
    started = time.monotonic()
    try:
        helm(
            helm_bin,
            "upgrade",
            name,
            previous_chart,
            "-n",
            namespace,
            "--kubeconfig",
            node["NODE_KUBECONFIG"],
            "--reuse-values",
            "--set",
            f"delivery.ingestURL={ingest_url}",
            "--wait",
            "--timeout",
            INSTALL_TIMEOUT,
        )
    except AssertionError as exc:
        pytest.fail(f"{exc}\n{describe(ckubectl, namespace)}", pytrace=False)
    configured = time.monotonic() - started
    # Hand-off sync: an upload whose push a stopping pod refused is lost, so the rolling
    # update must keep every one (the chart's preStop pause, grace and connection drain).
    bucket = f"cluster-upgrade-{suffix}"
    spec = {
        "endpoint": {"http": {"url": f"{receiver.url}/upgrade"}},
        "persistent": True,
        "delivery": {"handoff": "sync", "shards": 4},
    }
    notified_bucket(ckubectl, rgw, namespace, bucket, "webhook-sync", spec, "uploads-sync")
    repository, _, tag = image.rpartition(":")
    values = [
        *(v for v in values if not v.startswith(("image.repository=", "image.tag="))),
        f"image.repository={repository}",
        f"image.tag={tag}",
    ]
    started = time.monotonic()
    with Uploads(rgw, bucket, "upgrade") as uploads:
        time.sleep(3)
        began = time.time()
        try:
            helm(
                helm_bin, "upgrade", name, str(CHART), "-n", namespace,
                "--kubeconfig", node["NODE_KUBECONFIG"], "--reuse-values",
                "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
                "--wait", "--timeout", INSTALL_TIMEOUT,
            )  # fmt: skip
        except AssertionError as exc:
            pytest.fail(f"{exc}\n{describe(ckubectl, namespace)}", pytrace=False)
        last_ready = max(ready_since(p) for p in release_pods(ckubectl, namespace, image))
        time.sleep(3)
    upgraded = time.monotonic() - started
    print(
        f"helm install --wait ({previous}): {installed:.0f} s; helm upgrade --wait with the"
        f" ingest URL: {configured:.0f} s; helm upgrade --wait to {image}: {upgraded:.0f} s"
    )
    upgrade = Upgrade(
        previous,
        image,
        bucket,
        uploads.acknowledged,
        during=uploads.acknowledged_between(began, last_ready),
        failed=uploads.failed,
        began=began,
        last_ready=last_ready,
    )
    yield Release(name, namespace, ingest_url, values, watched, upgrade)
    print(describe(ckubectl, namespace)[-6000:])
    helm(
        helm_bin,
        "uninstall",
        name,
        "-n",
        namespace,
        "--kubeconfig",
        node["NODE_KUBECONFIG"],
        "--wait",
        check=False,
    )
    for ns in watched:
        ckubectl.run("delete", "namespace", ns, "--wait=false", check=False)
