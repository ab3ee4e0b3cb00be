"""Rendering the chart and the kustomize trees, as a user's `helm template` and `kubectl
kustomize` do, and the one normalisation that makes deploy/base comparable with the chart;
the install tests' chart values with every option on, and their server-side apply.

``python -m tests.install.manifests`` writes deploy/base/bucketnotify.yaml from the chart's
defaults (`make manifests`); tests/install/test_manifests.py fails when it is out of date.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable, Sequence
from copy import deepcopy
from pathlib import Path
from typing import Any

import yaml

from devstack.kubectl import Kubectl
from devstack.services import LOCAL, REPO

CHART = REPO / "charts" / "bucketnotify"
BASE = REPO / "deploy" / "base"
BASE_MANIFEST = BASE / "bucketnotify.yaml"
SAMPLES = REPO / "deploy" / "samples"
# deploy/base is the chart rendered as release "bucketnotify" in namespace "bucketnotify".
BASE_RELEASE = "bucketnotify"
BASE_NAMESPACE = "bucketnotify"
# ... without the admission webhook: its certificate and private key would be the same for
# every kustomize user (committed here). docs/operator.md says how to add it.
BASE_SETS = ("webhook.enabled=false",)
# Labels that say "Helm manages this": true of the chart's objects, false of the base's.
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")
# Whom the apiserver records as the manager of the fields the install tests apply.
FIELD_MANAGER = "bucketnotify-install-test"

# Every optional part switched on, the non-default variants chosen: what `helm lint` and the
# dry-run install test see besides the defaults.
ALL_OPTIONS: dict[str, Any] = {
    "watchNamespaces": ["team-a", "team-b"],
    "gateway": {
        "create": True,
        "endpoint": "http://rgw.example:8080",
        "accessKey": "AK",
        "secretKey": "SK",
        "region": "zg",
        "caConfigMap": "gateway-ca",
    },
    "image": {"digest": "sha256:" + "a" * 64},
    "operator": {"antiAffinity": "hard", "extraEnv": [{"name": "X", "value": "1"}]},
    "delivery": {
        "replicas": 1,
        "store": {"type": "dir"},
        "antiAffinity": "none",
        "ingestURL": "http://ingest.example:8085",
        "service": {"type": "NodePort"},
    },
    "metrics": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
    },
    "networkPolicy": {
        "enabled": True,
        "ingestFrom": [{"namespaceSelector": {"matchLabels": {"name": "rook-ceph"}}}],
        "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
    },
    "report": {
        "enabled": True,
        "image": "registry.example.com/storage/bucketnotify-report:0.1.0",
        "arguments": ["--date", "2026-01-01"],
    },
}

Obj = dict[str, Any]


def local_tool(name: str) -> str:
    """The path of a CLI that deploy/local/<name>.sh builds from its Go module on first use
    (helm, promtool)."""
    result = subprocess.run(
        ["bash", str(LOCAL / f"{name}.sh"), "path"],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"deploy/local/{name}.sh could not provide {name}:\n{result.stderr}")
    return result.stdout.strip().splitlines()[-1]


def helm_binary() -> str:
    return local_tool("helm")


PREVIOUS_RELEASE = "c11807d139c0a95529e1d4a50cf8bea43cf659c7"
"""The release our users run before this one. The cluster tier installs its chart and image
(built from this commit as its release was) and upgrades them to ours under a stream of
uploads; the chart tests render ours with its values alone, as `helm upgrade
--reuse-values` does. Moved on at each release (CHANGELOG.md)."""

KUBE_VERSION = "1.30.0"
"""What ``helm template`` renders for, as a user must say: the chart's ``kubeVersion`` is
1.30 or later, and helm's offline default is 1.20."""


def helm(helm_bin: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    if args[:1] == ("template",) and "--kube-version" not in args:
        args = (*args, "--kube-version", KUBE_VERSION)
    result = subprocess.run(
        [helm_bin, *args], capture_output=True, text=True, timeout=300, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def template(
    helm_bin: str,
    release: str = BASE_RELEASE,
    namespace: str = BASE_NAMESPACE,
    values: Sequence[str] = (),
    sets: Sequence[str] = (),
    tests: bool = False,
) -> list[Obj]:
    """``helm template`` of the chart as objects; ``tests``: with the ``helm test`` hooks
    (what ``helm install`` leaves out until ``helm test``)."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    if not tests:
        args.append("--skip-tests")
    for path in values:
        args += ["--values", path]
    for item in sets:
        args += ["--set-json", item]
    return load_all(helm(helm_bin, *args).stdout)


def kustomize(kubectl_bin: str, path: Path) -> list[Obj]:
    result = subprocess.run(
        [kubectl_bin, "kustomize", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"kubectl kustomize {path} failed:\n{result.stderr}")
    return load_all(result.stdout)


def apply(kubectl: Kubectl, objs: list[Obj], namespace: str, *extra: str) -> str:
    """Server-side apply of ``objs`` as one List into ``namespace``; kubectl's output."""
    listed = {"apiVersion": "v1", "kind": "List", "items": objs}
    return kubectl.run(
        "apply",
        "--server-side",
        "--force-conflicts",
        f"--field-manager={FIELD_MANAGER}",
        "-n",
        namespace,
        "-f",
        "-",
        *extra,
        stdin=json.dumps(listed),
    ).stdout


def load_all(text: str) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def dump_all(objs: Iterable[Obj]) -> str:
    return "---\n".join(yaml.safe_dump(obj, sort_keys=True) for obj in objs)


def _drop_helm_labels(meta: Obj) -> None:
    labels = meta.get("labels") or {}
    for key in HELM_ONLY_LABELS:
        labels.pop(key, None)


def without_helm(objs: Iterable[Obj]) -> list[Obj]:
    """The objects as kustomize users get them: no Helm labels, no namespace (the
    kustomization sets it), in a stable order."""
    out = []
    for original in objs:
        obj = deepcopy(original)
        meta = obj["metadata"]
        meta.pop("namespace", None)
        _drop_helm_labels(meta)
        template_meta = ((obj.get("spec") or {}).get("template") or {}).get("metadata")
        if template_meta is not None:
            _drop_helm_labels(template_meta)
        out.append(obj)
    return sorted(out, key=key_of)


def key_of(obj: Obj) -> tuple[str, str, str]:
    return (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


BASE_HEADER = """\
# Generated from charts/bucketnotify with its default values by `make manifests`; do not edit.
# Release "bucketnotify"; kustomization.yaml sets the namespace. Customise with an overlay.
"""


def main(argv: list[str]) -> int:
    objs = without_helm(template(helm_binary(), sets=BASE_SETS))
    BASE_MANIFEST.write_text(BASE_HEADER + "---\n" + dump_all(objs))
    print(f"wrote {len(objs)} objects to {BASE_MANIFEST.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
