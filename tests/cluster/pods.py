"""Looking at the pods of a release on the test cluster: which are up, and what a user would
read when an install does not come up."""

from __future__ import annotations

import json
from dataclasses import dataclass
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
