"""The operator's own API client finds its credentials as kubectl does, and follows them
when they change (a rotated service account token, an exec plugin's new token), against
the real kube-apiserver."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import shutil
import stat
import sys
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from bucketnotify.kube import apiserver
from devstack.kubectl import Kubectl
from tests.localservices import LocalService

WHO_AM_I = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


async def username(api: apiserver.ApiClient) -> str:
    """Who the API server says this client is (any authenticated user may ask)."""
    answer = await api.create(
        WHO_AM_I, {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    )
    return str(answer["status"]["userInfo"]["username"])


def service_account_token(kubectl: Kubectl, namespace: str, name: str) -> str:
    kubectl.run("create", "serviceaccount", name, "-n", namespace)
    return kubectl.run("create", "token", name, "-n", namespace).stdout.strip()


def admin_config(kube: LocalService) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(Path(kube["KUBECONFIG_ADMIN"]).read_text())
    return document


def in_a_pod(
    kube: LocalService,
    kubectl: Kubectl,
    namespace: str,
    tmp_path: Path,
    env: pytest.MonkeyPatch,
) -> tuple[Path, str]:
    """The environment of a pod: $KUBERNETES_SERVICE_HOST/PORT and a service account
    directory holding the CA, the namespace and the token of ServiceAccount "first".
    Returns the directory and the token of a second ServiceAccount, "second"."""
    cluster = admin_config(kube)["clusters"][0]["cluster"]
    host, port = cluster["server"].removeprefix("https://").rsplit(":", 1)
    account = tmp_path / "serviceaccount"
    account.mkdir()
    shutil.copy(cluster["certificate-authority"], account / "ca.crt")
    (account / "namespace").write_text(namespace)
    (account / "token").write_text(service_account_token(kubectl, namespace, "first"))
    env.setenv("KUBERNETES_SERVICE_HOST", host)
    env.setenv("KUBERNETES_SERVICE_PORT", port)
    env.setattr(apiserver, "SERVICE_ACCOUNT", account)
    return account, service_account_token(kubectl, namespace, "second")


@pytest.fixture()
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for variable in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(variable, raising=False)
    return monkeypatch


async def test_relative_certificate_paths_start_at_the_kubeconfig_file(
    kube: LocalService, tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    """kubectl reads a relative ``client-certificate`` from the kubeconfig's directory, not
    from the working directory; so does the operator."""
    document = admin_config(kube)
    for section, keys in (
        ("clusters", ("certificate-authority",)),
        ("users", ("client-certificate", "client-key")),
    ):
        for item in document[section]:
            body = item["cluster" if section == "clusters" else "user"]
            for key in keys:
                if key in body:
                    copied = tmp_path / "pki" / Path(body[key]).name
                    copied.parent.mkdir(exist_ok=True)
                    shutil.copy(body[key], copied)
                    body[key] = f"pki/{copied.name}"
    (tmp_path / "config").write_text(yaml.safe_dump(document))
    clean_env.setenv("KUBECONFIG", str(tmp_path / "config"))
    clean_env.chdir("/")

    async with await apiserver.connect() as api:
        assert await username(api) == await _admin_name(kube)


async def _admin_name(kube: LocalService) -> str:
    os.environ["KUBECONFIG"] = kube["KUBECONFIG_ADMIN"]
    try:
        async with await apiserver.connect() as api:
            return await username(api)
    finally:
        del os.environ["KUBECONFIG"]


async def test_an_exec_plugin_is_asked_again_when_its_token_is_refused(
    kube: LocalService,
    kubectl: Kubectl,
    namespace: str,
    tmp_path: Path,
    clean_env: pytest.MonkeyPatch,
) -> None:
    """A kubeconfig whose user is an exec plugin (EKS, GKE and OIDC helpers): its token is
    used, and a 401 (the token lapsed before its stated expiry) runs the plugin again once
    instead of failing the request."""
    token = service_account_token(kubectl, namespace, "exec-user")
    runs = tmp_path / "runs"
    plugin = tmp_path / "credential-plugin"
    # First run: a token the API server refuses; later runs: the real one.
    plugin.write_text(
        f"#!{sys.executable}\n"
        "import json, pathlib, sys\n"
        f"runs = pathlib.Path({str(runs)!r})\n"
        "count = int(runs.read_text()) + 1 if runs.exists() else 1\n"
        "runs.write_text(str(count))\n"
        f"token = 'not-a-token' if count == 1 else {token!r}\n"
        "json.dump({'apiVersion': 'client.authentication.k8s.io/v1',"
        " 'kind': 'ExecCredential', 'status': {'token': token}}, sys.stdout)\n"
    )
    plugin.chmod(plugin.stat().st_mode | stat.S_IEXEC)
    document = admin_config(kube)
    document["users"] = [
        {
            "name": document["contexts"][0]["context"]["user"],
            "user": {
                "exec": {
                    "apiVersion": "client.authentication.k8s.io/v1",
                    "command": str(plugin),
                    "interactiveMode": "Never",
                }
            },
        }
    ]
    (tmp_path / "config").write_text(yaml.safe_dump(document))
    clean_env.setenv("KUBECONFIG", str(tmp_path / "config"))

    async with await apiserver.connect() as api:
        assert runs.read_text() == "1"
        assert await username(api) == f"system:serviceaccount:{namespace}:exec-user"
        assert runs.read_text() == "2"


async def test_in_a_pod_the_rotated_service_account_token_is_read_again(
    kube: LocalService,
    kubectl: Kubectl,
    namespace: str,
    tmp_path: Path,
    clean_env: pytest.MonkeyPatch,
) -> None:
    """In a pod (no $KUBECONFIG): the API server from $KUBERNETES_SERVICE_HOST/PORT, the
    token and CA from the service account's files; the kubelet rotates the token in its
    file, and the client picks the new one up at its next re-read."""
    account, second = in_a_pod(kube, kubectl, namespace, tmp_path, clean_env)
    assert apiserver.current_namespace() == namespace

    async with await apiserver.connect() as api:
        assert await username(api) == f"system:serviceaccount:{namespace}:first"
        (account / "token").write_text(second)
        # Until the re-read (a minute) the token in hand goes on being used...
        assert await username(api) == f"system:serviceaccount:{namespace}:first"
        # ... and after it, the rotated one.
        clean_env.setattr(api, "_info", _expired_copy(api.info))
        assert await username(api) == f"system:serviceaccount:{namespace}:second"


async def test_a_failed_re_read_keeps_the_credentials_in_hand(
    kube: LocalService,
    kubectl: Kubectl,
    namespace: str,
    tmp_path: Path,
    clean_env: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The token file missing at the moment of a re-read (the kubelet replaces it through a
    symlink swap): the token in hand, still valid, goes on being used, and the next re-read
    finds the new one."""
    account, second = in_a_pod(kube, kubectl, namespace, tmp_path, clean_env)
    clean_env.setattr(apiserver, "RELOAD_RETRY_S", 0.0)

    async with await apiserver.connect() as api:
        (account / "token").unlink()
        clean_env.setattr(api, "_info", _expired_copy(api.info))
        assert await username(api) == f"system:serviceaccount:{namespace}:first"
        assert "reading the Kubernetes credentials again failed" in caplog.text
        (account / "token").write_text(second)
        assert await username(api) == f"system:serviceaccount:{namespace}:second"


def _expired_copy(info: kopf.ConnectionInfo) -> kopf.ConnectionInfo:
    return dataclasses.replace(info, expiration=dt.datetime.now(dt.UTC))


async def test_no_kubeconfig_and_no_pod_is_a_clear_error(
    tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    clean_env.setenv("HOME", str(tmp_path))
    with pytest.raises(apiserver.ConfigError, match=r"no \$KUBECONFIG, no .*\.kube/config"):
        await apiserver.connect()
    clean_env.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(apiserver.ConfigError, match=r"no file of \$KUBECONFIG exists"):
        await apiserver.connect()


async def test_without_kubeconfig_outside_a_pod_the_home_kube_config_is_used(
    kube: LocalService,
    kubectl: Kubectl,
    namespace: str,
    tmp_path: Path,
    clean_env: pytest.MonkeyPatch,
) -> None:
    """As kubectl: no $KUBECONFIG and not in a pod, ``~/.kube/config``, its current context's
    user and namespace."""
    config = admin_config(kube)
    token = service_account_token(kubectl, namespace, "home")
    for user in config["users"]:
        user["user"] = {"token": token}
    for context in config["contexts"]:
        context["context"]["namespace"] = namespace
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text(yaml.safe_dump(config))
    clean_env.setenv("HOME", str(tmp_path))
    assert apiserver.current_namespace() == namespace
    async with await apiserver.connect() as api:
        assert await username(api) == f"system:serviceaccount:{namespace}:home"
