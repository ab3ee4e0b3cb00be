"""kubectl against the local apiserver: tests apply objects exactly as a user would."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class Kubectl:
    binary: str
    kubeconfig: str

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
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{result.stderr}")
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
