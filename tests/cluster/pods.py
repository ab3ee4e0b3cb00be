"""Looking at the pods of a release on the test cluster: which are up, and what a user would
read when an install does not come up."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.kubectl import Kubectl


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    ingest_url: str
    values: list[str]
    watched: list[str]
    """``watchNamespaces``: the release's own namespace first."""
    upgrade: Upgrade


@dataclass(frozen=True)
class Upgrade:
    """The release was installed as ``previous`` and upgraded to ``image`` while uploads to
    ``bucket`` (a Topic with hand-off sync) went on: the keys the gateway acknowledged."""

    previous: str
    image: str
    bucket: str
    acknowledged: list[str]
    during: list[str]
    """The uploads acknowledged between the start of ``helm upgrade`` and the moment the
    last pod of ``image`` became Ready: the stream overlapped the rollout by these."""
    failed: list[str]
    began: float
    last_ready: float


def pods(kubectl: Kubectl, namespace: str, component: str) -> list[dict[str, Any]]:
    listed = kubectl.run(
        "get",
        "pods",
        "-n",
        namespace,
        "-l",
        f"app.kubernetes.io/component={component}",
        "-o",
        "json",
    ).stdout
    return [p for p in json.loads(listed)["items"] if not p["metadata"].get("deletionTimestamp")]


def release_pods(kubectl: Kubectl, namespace: str, image: str) -> list[dict[str, Any]]:
    """The operator and delivery pods of ``namespace`` that run ``image``."""
    return [
        pod
        for component in ("operator", "delivery")
        for pod in pods(kubectl, namespace, component)
        if all(c["image"].endswith(image) for c in pod["spec"]["containers"])
    ]


def ready_since(pod: dict[str, Any]) -> float:
    """When ``pod`` last became Ready (its condition's transition, epoch seconds)."""
    [condition] = [c for c in pod["status"]["conditions"] if c["type"] == "Ready"]
    assert condition["status"] == "True", f"{pod['metadata']['name']} is not Ready"
    return dt.datetime.fromisoformat(condition["lastTransitionTime"]).timestamp()


def container_processes(pod: dict[str, Any], command: str) -> list[int]:
    """The host PIDs of ``pod``'s processes whose command line holds ``command``: its
    containers run on this node, their processes in the pod's cgroup (``pod<uid>``)."""
    marker = f"pod{pod['metadata']['uid']}"
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cgroups = (proc / "cgroup").read_text()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone meanwhile
            continue
        if marker in cgroups and command in cmdline:
            found.append(int(proc.name))
    return found


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def describe(kubectl: Kubectl, namespace: str) -> str:
    """What a user would look at when an install does not come up."""
    out = [kubectl.run("get", "pods,events", "-n", namespace, "-o", "wide", check=False).stdout]
    for component in ("operator", "delivery"):
        for pod in pods(kubectl, namespace, component):
            name = pod["metadata"]["name"]
            logs = kubectl.run("logs", "-n", namespace, name, "--tail=40", check=False)
            out.append(f"--- {name} ---\n{logs.stdout}{logs.stderr}")
    return "\n".join(out)


def describe_all(kubectl: Kubectl, namespace: str) -> str:
    """The pods and events of a namespace and the last log lines of every pod in it."""
    out = [kubectl.run("get", "pods,events", "-n", namespace, "-o", "wide", check=False).stdout]
    listed = kubectl.run("get", "pods", "-n", namespace, "-o", "json", check=False).stdout
    for pod in json.loads(listed or '{"items": []}')["items"]:
        name = pod["metadata"]["name"]
        logs = kubectl.run("logs", "-n", namespace, name, "--tail=40", check=False)
        out.append(f"--- {name} ---\n{logs.stdout}{logs.stderr}")
    return "\n".join(out)
