"""deploy/spark/ is accepted by a real apiserver with the Spark operator's v1beta2 CRDs."""

from __future__ import annotations

import time
import uuid

import pytest
import yaml

from tests.kubectl import Kubectl
from tests.localservices import REPO

pytestmark = pytest.mark.integration

SPARK = REPO / "deploy" / "spark"


@pytest.fixture(scope="module")
def spark_crds(kubectl: Kubectl) -> None:
    kubectl.apply_path(SPARK / "crds")
    for name in ("sparkapplications", "scheduledsparkapplications"):
        # `kubectl wait` fails outright while a new CRD has no conditions yet: poll instead,
        # through answers the apiserver gives while it installs the new API (a CI run once
        # failed here on one such answer, whose text it did not keep).
        established = "{.status.conditions[?(@.type=='Established')].status}"
        deadline = time.monotonic() + 60
        last = ""
        while time.monotonic() < deadline:
            got = kubectl.run(
                "get",
                f"crd/{name}.sparkoperator.k8s.io",
                "-o",
                f"jsonpath={established}",
                check=False,
            )
            if got.returncode == 0 and got.stdout == "True":
                break
            last = got.stderr.strip() or f"Established={got.stdout!r}"
            time.sleep(0.5)
        else:
            raise AssertionError(
                f"the CRD {name}.sparkoperator.k8s.io never became Established: {last}"
            )


def dry_run(kubectl: Kubectl, namespace: str, *args: str, stdin: str | None = None) -> str:
    result = kubectl.run(
        "apply",
        "-n",
        namespace,
        "--dry-run=server",
        "--validate=strict",
        *args,
        stdin=stdin,
        check=False,
    )
    return result.stderr if result.returncode else ""


def test_manifests_pass_server_side_dry_run(
    kubectl: Kubectl, spark_crds: None, namespace: str
) -> None:
    """The one-off and the daily application, their RBAC and the Secret example validate
    strictly (unknown fields refused), alone and through the kustomization."""
    for name in (
        "gateway-secret.example.yaml",
        "rbac.yaml",
        "sparkapplication.yaml",
        "scheduledsparkapplication.yaml",
    ):
        assert dry_run(kubectl, namespace, "-f", str(SPARK / name)) == "", name
    assert dry_run(kubectl, namespace, "-k", str(SPARK)) == ""


@pytest.mark.parametrize(
    ("path", "value", "complaint"),
    [
        (("spec", "type"), "Pyhton", "Unsupported value"),
        (("spec", "restartPolicy", "type"), "Sometimes", "Unsupported value"),
        (("spec", "driver", "corse"), 1, "unknown field"),
    ],
)
def test_dry_run_refuses_a_broken_application(
    kubectl: Kubectl,
    spark_crds: None,
    namespace: str,
    path: tuple[str, ...],
    value: object,
    complaint: str,
) -> None:
    """The dry-run really checks the schema: a typo in the manifest is refused."""
    app = yaml.safe_load((SPARK / "sparkapplication.yaml").read_text())
    app["metadata"]["name"] = f"broken-{uuid.uuid4().hex[:6]}"
    target = app
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    error = dry_run(kubectl, namespace, "-f", "-", stdin=yaml.safe_dump(app))
    assert complaint in error, error
