"""Programs run as a ServiceAccount, as in a pod: a kubeconfig holding one of its tokens."""

from __future__ import annotations

import json
from pathlib import Path

from tests.kubectl import Kubectl
from tests.localservices import LocalService


def token_kubeconfig(
    kube: LocalService, kubectl: Kubectl, namespace: str, service_account: str, workdir: Path
) -> str:
    """The path of a kubeconfig with a TokenRequest token of ``service_account``: its rights
    only, and the API server sees its name (RBAC, audit, API Priority and Fairness)."""
    token = kubectl.run(
        "create", "token", service_account, "-n", namespace, "--duration=2h"
    ).stdout.strip()
    path = workdir / f"{namespace}-{service_account}.kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "local",
                        "cluster": {
                            "server": kube["KUBE_SERVER"],
                            "certificate-authority": kube["KUBE_CA_CERT"],
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
                            "namespace": namespace,
                        },
                    }
                ],
                "current-context": "sa",
            }
        )
    )
    return str(path)
