"""Kubeconfigs for the programs a test runs: as a ServiceAccount (a token of its own), or
as the admin through a proxy the test can cut."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from devstack.servers.tcpproxy import TcpProxy
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


def proxied_kubeconfig(kube: LocalService, path: Path) -> TcpProxy:
    """The admin kubeconfig written to ``path`` with the API server behind a TCP proxy of
    the test's own (not started): a test cuts or redirects the proxy to take the API server
    away from the programs using ``path`` and from nobody else."""
    kubeconfig = yaml.safe_load(Path(kube["KUBECONFIG_ADMIN"]).read_text())
    server = urlsplit(kubeconfig["clusters"][0]["cluster"]["server"])
    assert server.hostname is not None and server.port is not None
    proxy = TcpProxy(server.hostname, server.port)
    for cluster in kubeconfig["clusters"]:
        cluster["cluster"]["server"] = f"https://{proxy.host}:{proxy.port}"
    path.write_text(yaml.safe_dump(kubeconfig))
    return proxy
