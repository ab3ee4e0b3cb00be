"""kubectl against the local apiserver: objects are applied exactly as a user would."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devstack.services import REPO, Service

__all__ = ["Kubectl", "KubectlError"]


class KubectlError(AssertionError):
    """kubectl failed. An AssertionError, so that in a test it is the test's failure."""


@dataclass(frozen=True)
class Kubectl:
    binary: str
    kubeconfig: str

    @classmethod
    def admin(cls, kube: Service) -> Kubectl:
        """kubectl as the cluster admin of the local control plane (``kube.sh``)."""
        return cls(kube["KUBECTL"], kube["KUBECONFIG_ADMIN"])

    def run(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.binary, "--kubeconfig", self.kubeconfig, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check and result.returncode != 0:
            raise KubectlError(f"kubectl {' '.join(args)} failed:\n{result.stderr}")
        return result

    def apply(self, obj: dict[str, Any], check: bool = True) -> subprocess.CompletedProcess[str]:
        # JSON, not YAML: kubectl reads YAML 1.1, where a bare `n` or `no` is a boolean.
        return self.run("apply", "-f", "-", stdin=json.dumps(obj), check=check)

    def apply_path(self, path: Path) -> None:
        self.run("apply", "--server-side", "--force-conflicts", "-f", str(path))

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any]:
        out = self.run("get", kind, name, "-n", namespace, "-o", "yaml").stdout
        loaded: dict[str, Any] = yaml.safe_load(out)
        return loaded

    def install_crds(self) -> None:
        """The CRDs of crds/ installed and Established, as `kubectl apply -f crds/` does."""
        self.apply_path(REPO / "crds")
        self.run("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
