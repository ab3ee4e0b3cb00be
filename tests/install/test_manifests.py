"""deploy/base is the chart's defaults, and every way of installing applies cleanly to the real
apiserver: server-side apply, a second apply that changes nothing (what a GitOps controller
does every few minutes), and a server dry-run of the optional parts."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.install.manifests import (
    ALL_OPTIONS,
    BASE,
    BASE_MANIFEST,
    BASE_NAMESPACE,
    BASE_RELEASE,
    BASE_SETS,
    CHART,
    Obj,
    apply,
    helm,
    key_of,
    kustomize,
    load_all,
    template,
    without_helm,
)
from tests.kubectl import Kubectl
from tests.localservices import REPO


def test_base_is_the_rendered_chart(helm_bin: str) -> None:
    """deploy/base/bucketnotify.yaml is what `make manifests` writes from the chart today."""
    rendered = without_helm(template(helm_bin, sets=BASE_SETS))
    committed = load_all(BASE_MANIFEST.read_text())
    assert [key_of(o) for o in committed] == [key_of(o) for o in rendered], (
        "deploy/base is out of date: run `make manifests`"
    )
    assert committed == rendered, "deploy/base is out of date: run `make manifests`"


def test_kustomize_build_equals_the_chart_defaults(helm_bin: str, kubectl: Kubectl) -> None:
    """`kubectl kustomize deploy/base` gives the chart's default objects, in its namespace."""
    built = kustomize(kubectl.binary, BASE)
    namespaces = [o for o in built if o["kind"] == "Namespace"]
    assert [n["metadata"]["name"] for n in namespaces] == [BASE_NAMESPACE]
    rest = [o for o in built if o["kind"] != "Namespace"]
    chart = template(helm_bin, release=BASE_RELEASE, namespace=BASE_NAMESPACE, sets=BASE_SETS)
    cluster_scoped = {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
    for obj in rest:
        if obj["kind"] not in cluster_scoped:
            assert obj["metadata"]["namespace"] == BASE_NAMESPACE, key_of(obj)
    assert without_helm(rest) == without_helm(chart)


def api_kinds(kubectl: Kubectl) -> set[tuple[str, str]]:
    """(group, kind) of every resource the apiserver serves."""
    out = kubectl.run("api-resources", "-o", "wide", "--no-headers").stdout
    found: set[tuple[str, str]] = set()
    for line in out.splitlines():
        cols = line.split()
        # NAME [SHORTNAMES] APIVERSION NAMESPACED KIND VERBS [CATEGORIES]
        idx = next(i for i, c in enumerate(cols) if c in ("true", "false"))
        version, kind = cols[idx - 1], cols[idx + 1]
        found.add((version.rpartition("/")[0], kind))
    return found


def group_of(obj: Obj) -> str:
    return str(obj["apiVersion"]).rpartition("/")[0]


def versions(kubectl: Kubectl, objs: list[Obj], namespace: str) -> dict[tuple[str, ...], Any]:
    listed = {"apiVersion": "v1", "kind": "List", "items": objs}
    got = json.loads(
        kubectl.run(
            "get", "-n", namespace, "-f", "-", "-o", "json", stdin=json.dumps(listed)
        ).stdout
    )
    items = got.get("items", [got])
    return {
        (i["kind"], i["metadata"].get("namespace", ""), i["metadata"]["name"]): i["metadata"][
            "resourceVersion"
        ]
        for i in items
    }


def assert_apply_twice_changes_nothing(kubectl: Kubectl, objs: list[Obj], namespace: str) -> None:
    apply(kubectl, objs, namespace)
    first = versions(kubectl, objs, namespace)
    assert len(first) == len(objs)
    second_out = apply(kubectl, objs, namespace)
    second = versions(kubectl, objs, namespace)
    changed = {k for k in first if first[k] != second[k]}
    assert not changed, f"the second apply changed {changed}:\n{second_out}"


def forget_webhook(kubectl: Kubectl, release: str) -> None:
    """Delete the release's webhook configuration: cluster-wide, it outlives the test's
    namespace, and with no operator pod behind it every later write of a Topic in the shared
    API server would call it in vain."""
    kubectl.run(
        "delete",
        "validatingwebhookconfiguration",
        "-l",
        f"app.kubernetes.io/instance={release}",
        "--ignore-not-found",
    )


def test_helm_template_applies_and_reapplies_unchanged(
    helm_bin: str, kubectl: Kubectl, namespace: str
) -> None:
    """The chart's defaults, as a release of its own in a fresh namespace (a release name
    with the chart's name in it is the objects' name prefix)."""
    release = f"bucketnotify-{uuid.uuid4().hex[:8]}"
    objs = template(helm_bin, release=release, namespace=namespace)
    try:
        assert_apply_twice_changes_nothing(kubectl, objs, namespace)
    finally:
        forget_webhook(kubectl, release)
    deployments = kubectl.run("get", "deployments", "-n", namespace, "-o", "name").stdout.split()
    assert sorted(deployments) == [
        f"deployment.apps/{release}-delivery",
        f"deployment.apps/{release}-operator",
    ]


def test_gitops_overlay_applies_and_reapplies_unchanged(kubectl: Kubectl) -> None:
    """deploy/overlays/example (the README's GitOps example): another namespace everywhere,
    the RBAC subjects included, and a pinned image."""
    objs = kustomize(kubectl.binary, REPO / "deploy" / "overlays" / "example")
    target = "bucketnotify-example"
    for obj in objs:
        if obj["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            assert {s["namespace"] for s in obj["subjects"]} == {target}, obj["metadata"]["name"]
        if obj["kind"] == "Deployment":
            (container,) = obj["spec"]["template"]["spec"]["containers"]
            assert container["image"] == "registry.example.com/storage/bucketnotify:0.1.0"
    namespaces = [o for o in objs if o["kind"] == "Namespace"]
    assert [n["metadata"]["name"] for n in namespaces] == [target]
    # The Namespace first, as a GitOps controller orders it.
    apply(kubectl, namespaces, target)
    assert_apply_twice_changes_nothing(kubectl, objs, target)


def test_every_option_passes_a_server_dry_run(
    helm_bin: str, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """ServiceMonitor, PrometheusRule, NetworkPolicy, the Spark report, the dir store's claim,
    namespaced RBAC: the apiserver accepts each object of a kind it serves; kinds of
    operators not installed here (Prometheus Operator, Spark operator) are the only ones
    left out."""
    values = {**ALL_OPTIONS, "watchNamespaces": [namespace]}
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    release = f"bucketnotify-{uuid.uuid4().hex[:8]}"
    objs = template(helm_bin, release=release, namespace=namespace, values=[str(path)])
    served = api_kinds(kubectl)
    accepted = [o for o in objs if (group_of(o), o["kind"]) in served]
    left_out = {(group_of(o), o["kind"]) for o in objs} - served
    assert left_out <= {
        ("monitoring.coreos.com", "ServiceMonitor"),
        ("monitoring.coreos.com", "PrometheusRule"),
        ("sparkoperator.k8s.io", "ScheduledSparkApplication"),
    }, left_out
    out = apply(kubectl, accepted, namespace, "--dry-run=server")
    assert out.count("(server dry run)") == len(accepted), out


def test_helm_install_then_upgrade_changes_nothing(
    helm_bin: str, kubectl: Kubectl, namespace: str, request: pytest.FixtureRequest
) -> None:
    """The README's `helm install`, then a `helm upgrade` with the same values: every object
    of the release keeps its resourceVersion. (The CRDs are already installed by kubectl
    here, so the release leaves them out: Helm does not adopt objects it did not create.)"""
    release = f"bucketnotify-{uuid.uuid4().hex[:8]}"
    common = [
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--kubeconfig",
        kubectl.kubeconfig,
        "--set",
        "crds.install=false",
        "--set",
        "image.repository=registry.example.com/storage/bucketnotify",
    ]
    helm(helm_bin, "install", *common)
    request.addfinalizer(lambda: forget_webhook(kubectl, release))
    manifest = load_all(
        helm(
            helm_bin,
            "get",
            "manifest",
            release,
            "-n",
            namespace,
            "--kubeconfig",
            kubectl.kubeconfig,
        ).stdout
    )
    assert {o["kind"] for o in manifest} >= {"Deployment", "ClusterRole", "Service"}
    before = versions(kubectl, manifest, namespace)
    helm(helm_bin, "upgrade", *common)
    after = versions(kubectl, manifest, namespace)
    assert before == after
