"""The Helm chart: lint-clean, every value validated, and every option renders."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from bucketnotify.delivery.service import DRAIN_MAX_S
from tests.install.manifests import (
    ALL_OPTIONS,
    BASE_RELEASE,
    CHART,
    PREVIOUS_RELEASE,
    helm,
    load_all,
    template,
)
from tests.promql import metric_names, our_series


@pytest.fixture()
def all_options(tmp_path: Path) -> str:
    path = tmp_path / "all-options.yaml"
    path.write_text(yaml.safe_dump(ALL_OPTIONS))
    return str(path)


def test_helm_lint_is_clean(helm_bin: str, all_options: str) -> None:
    """`helm lint --strict` passes with no warning, for the defaults and for every option."""
    for args in ([], ["--values", all_options]):
        result = helm(helm_bin, "lint", "--strict", str(CHART), *args, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


def kinds(objs: list[dict[str, Any]]) -> set[str]:
    return {o["kind"] for o in objs}


def test_defaults_render_the_whole_system(helm_bin: str) -> None:
    objs = template(helm_bin)
    assert kinds(objs) == {
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "Secret",
        "ValidatingWebhookConfiguration",
    }
    crds = {o["metadata"]["name"] for o in objs if o["kind"] == "CustomResourceDefinition"}
    assert crds == {"topics.bucketnotify.io", "bucketnotifications.bucketnotify.io"}
    for crd in (o for o in objs if o["kind"] == "CustomResourceDefinition"):
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


def test_every_option_renders(helm_bin: str, all_options: str) -> None:
    objs = template(helm_bin, values=[all_options])
    assert {"ServiceMonitor", "NetworkPolicy", "ScheduledSparkApplication", "Secret"} <= kinds(objs)
    assert "PersistentVolumeClaim" in kinds(objs), "the dir store gets its volume"
    roles = [o for o in objs if o["kind"] == "Role" and o["metadata"].get("namespace")]
    assert {r["metadata"]["namespace"] for r in roles} == {"team-a", "team-b"}
    assert not [
        o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("delivery")
    ], "watchNamespaces: no cluster-wide rights for the namespaced resources"


@pytest.mark.parametrize(
    ("sets", "complaint"),
    [
        (['delivery.replicas="three"'], "'/delivery/replicas': got string, want integer"),
        (['delivery.storee={"type":"s3"}'], "additional properties 'storee' not allowed"),
        (['delivery.store.type="nfs"'], "'/delivery/store/type'"),
        (['delivery.store={"type":"dir"}'], "'/delivery/replicas': maximum: got 3, want 1"),
        (["delivery.partitions=0"], "'/delivery/partitions': minimum: got 0"),
        (['operator.antiAffinity="always"'], "'/operator/antiAffinity'"),
        (['watchNamespaces=["Team_A"]'], "'/watchNamespaces/0'"),
        (['image.digest="latest"'], "'/image/digest'"),
        (['report.schedule="daily"'], "'/report/schedule'"),
        (['webhook.failurePolicy="Sometimes"'], "'/webhook/failurePolicy'"),
    ],
)
def test_schema_refuses_bad_values(helm_bin: str, sets: list[str], complaint: str) -> None:
    """A wrong value fails the install and names the value to fix (a JSON pointer)."""
    args = ["template", "x", str(CHART)]
    for item in sets:
        args += ["--set-json", item]
    result = helm(helm_bin, *args, check=False)
    assert result.returncode != 0
    assert complaint in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("gateway.create=true", "gateway.endpoint is required"),
        ("report.enabled=true", "report.image: the Spark job's image"),
    ],
)
def test_switches_name_the_values_they_need(helm_bin: str, setting: str, complaint: str) -> None:
    result = helm(helm_bin, "template", "x", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0
    assert complaint in result.stderr


def _env(objs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    (deployment,) = [
        o
        for o in objs
        if o["kind"] == "Deployment" and o["metadata"]["name"].endswith(f"-{component}")
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_settings_reach_the_programs_by_their_names(helm_bin: str) -> None:
    """Every BUCKETNOTIFY_* variable the chart sets is a setting of the program it runs, and
    every setting of each program is set by the chart: a setting added to settings.py without
    a chart value fails here."""
    from bucketnotify.settings import DeliveryServiceSettings, LogSettings, OperatorSettings

    def names(prefix: str, model: type[Any]) -> set[str]:
        return {f"{prefix}{n.upper()}" for n in model.model_fields}

    operator_fields = names("BUCKETNOTIFY_", OperatorSettings)
    delivery_fields = names("BUCKETNOTIFY_DELIVERY_", DeliveryServiceSettings)
    log_fields = names("BUCKETNOTIFY_LOG_", LogSettings)
    gateway_fields = {f for f in operator_fields if f.startswith("BUCKETNOTIFY_GATEWAY_")}
    objs = template(helm_bin)
    operator_env = {k for k in _env(objs, "operator") if k.startswith("BUCKETNOTIFY_")}
    delivery_env = {k for k in _env(objs, "delivery") if k.startswith("BUCKETNOTIFY_")}
    assert operator_env == operator_fields | log_fields
    # The delivery service reads the default gateway (an s3:// store) from OperatorSettings.
    assert delivery_env == delivery_fields | log_fields | gateway_fields
    assert _env(objs, "delivery")["BUCKETNOTIFY_DELIVERY_IDENTITY"] == {
        "fieldRef": {"fieldPath": "metadata.name"}
    }
    # The pod name: kopf would otherwise ask the user database, where uid 65532 is not.
    assert _env(objs, "operator")["BUCKETNOTIFY_IDENTITY"] == {
        "fieldRef": {"fieldPath": "metadata.name"}
    }
    # The namespaces the programs serve are the chart's, as JSON.
    assert json.loads(_env(objs, "operator")["BUCKETNOTIFY_NAMESPACES"]) == []


def test_probes_ask_the_event_loop_and_readiness(helm_bin: str) -> None:
    """Liveness on /healthz (answered by the event loop), readiness on /readyz, each on the
    port the program serves them on, never /metrics (answered from a thread)."""
    objs = template(helm_bin)
    probes = {}
    for component in ("operator", "delivery"):
        (deployment,) = [
            o
            for o in objs
            if o["kind"] == "Deployment" and o["metadata"]["name"].endswith(f"-{component}")
        ]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        env = _env(objs, component)
        served = int(
            env["BUCKETNOTIFY_METRICS_PORT"]
            if component == "operator"
            else env["BUCKETNOTIFY_DELIVERY_LISTEN_PORT"]
        )
        for kind in ("livenessProbe", "readinessProbe"):
            get = container[kind]["httpGet"]
            assert ports[get["port"]] == served
            probes[component, kind] = get["path"]
    assert probes == {
        ("operator", "livenessProbe"): "/healthz",
        ("operator", "readinessProbe"): "/readyz",
        ("delivery", "livenessProbe"): "/healthz",
        ("delivery", "readinessProbe"): "/readyz",
    }


# Every value here differs from its default, so a template that ignores a value, or renders
# the default whatever it is given, fails below.
CHANGED: dict[str, Any] = {
    "logging": {"format": "plain", "level": "DEBUG"},
    "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 1001, "fsGroup": 2002},
    "securityContext": {"readOnlyRootFilesystem": True, "runAsGroup": 3003},
    "gateway": {"caConfigMap": "gateway-ca-bundle"},
    "operator": {
        "driftIntervalSeconds": 45,
        "ownerId": "estate-7",
        "allowCleartextSecrets": True,
        "deleteGiveUpAfterSeconds": 900,
        "leaderElection": {
            "leaseName": "bn-leader",
            "leaseDurationSeconds": 21,
            "renewDeadlineSeconds": 14,
            "retryPeriodSeconds": 3,
        },
        "metricsPort": 9191,
        "livenessProbe": {"periodSeconds": 31, "failureThreshold": 4},
        "readinessProbe": {"periodSeconds": 11},
        "resources": {"requests": {"cpu": "70m", "memory": "100Mi"}},
    },
    "delivery": {
        "port": 9095,
        "partitions": 17,
        "leases": {"durationSeconds": 20, "renewIntervalSeconds": 4, "renewDeadlineSeconds": 9},
        "refreshIntervalSeconds": 5,
        "secretRefreshSeconds": 40,
        "tokenOverlapSeconds": 120,
        "idlePollMaxSeconds": 2,
        "sweepIntervalSeconds": 50,
        "reservationTimeoutSeconds": 25,
        "statsIntervalSeconds": 15,
        "records": {"target": "off", "flushSeconds": 7, "batchSize": 900, "bufferMax": 9000},
        "store": {"bucket": "estate-queues"},
        "livenessProbe": {"periodSeconds": 29},
        "readinessProbe": {"periodSeconds": 6, "timeoutSeconds": 2},
    },
}


def _container(objs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    (deployment,) = [
        o
        for o in objs
        if o["kind"] == "Deployment" and o["metadata"]["name"].endswith(f"-{component}")
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {"pod": deployment["spec"]["template"]["spec"], **container}


def _read_by_program(monkeypatch: pytest.MonkeyPatch, env: dict[str, Any], model: type[Any]) -> Any:
    """The settings the program itself would read from this environment (pydantic-settings,
    as at start); env entries filled from the pod (valueFrom) are left out."""
    import os

    for name in [n for n in os.environ if n.startswith("BUCKETNOTIFY_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        if isinstance(value, str) and name.startswith("BUCKETNOTIFY_"):
            monkeypatch.setenv(name, value.replace("$(POD_NAMESPACE)", "ns"))
    return model()


def test_changed_values_reach_the_programs_and_the_pods(
    helm_bin: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each value, set to something other than its default, is what the program reads at
    start (through its own settings classes) or what the pod spec carries."""
    from bucketnotify.settings import DeliveryServiceSettings, LogSettings, OperatorSettings

    path = tmp_path / "changed.yaml"
    path.write_text(yaml.safe_dump(CHANGED))
    objs = template(helm_bin, values=[str(path)])

    operator = _read_by_program(monkeypatch, _env(objs, "operator"), OperatorSettings)
    assert operator.drift_interval_seconds == 45
    assert operator.owner_id == "estate-7"
    assert operator.allow_cleartext_secrets is True
    assert operator.delete_give_up_after_seconds == 900
    assert operator.leader_election_lease == "bn-leader"
    assert (
        operator.lease_duration_seconds,
        operator.renew_deadline_seconds,
        operator.retry_period_seconds,
    ) == (21, 14, 3)
    assert operator.metrics_port == 9191

    delivery = _read_by_program(monkeypatch, _env(objs, "delivery"), DeliveryServiceSettings)
    assert delivery.listen_port == 9095
    assert delivery.partitions == 17
    assert delivery.store == "s3://estate-queues"
    assert (
        delivery.lease_duration_seconds,
        delivery.renew_interval_seconds,
        delivery.renew_deadline_seconds,
    ) == (20, 4, 9)
    assert (
        delivery.refresh_interval_seconds,
        delivery.secret_refresh_seconds,
        delivery.token_overlap_seconds,
        delivery.idle_poll_max_seconds,
        delivery.sweep_interval_seconds,
        delivery.reservation_timeout_seconds,
        delivery.stats_interval_seconds,
    ) == (5, 40, 120, 2, 50, 25, 15)
    assert (
        delivery.records,
        delivery.records_flush_seconds,
        delivery.records_batch_size,
        delivery.records_buffer_max,
    ) == ("off", 7, 900, 9000)
    # operator.allowCleartextSecrets is one policy for both programs.
    assert delivery.allow_cleartext_secrets is True

    for component in ("operator", "delivery"):
        logs = _read_by_program(monkeypatch, _env(objs, component), LogSettings)
        assert (logs.format, logs.level) == ("plain", "DEBUG")
        container = _container(objs, component)
        # Helm merges a values map into the default one: the keys set win, the rest stay.
        for rendered, given in (
            (container["pod"]["securityContext"], CHANGED["podSecurityContext"]),
            (container["securityContext"], CHANGED["securityContext"]),
        ):
            assert {k: rendered.get(k) for k in given} == given
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        served = operator.metrics_port if component == "operator" else delivery.listen_port
        for kind in ("livenessProbe", "readinessProbe"):
            assert ports[container[kind]["httpGet"]["port"]] == served
        # gateway.caConfigMap: the CA's PEM mounted where AWS_CA_BUNDLE (boto3) looks.
        (volume,) = [v for v in container["pod"]["volumes"] if "configMap" in v]
        assert volume["configMap"]["name"] == "gateway-ca-bundle"
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        (item,) = volume["configMap"]["items"]
        bundle = _env(objs, component)["AWS_CA_BUNDLE"]
        assert bundle == f"{mount['mountPath']}/{item['path']}"
        assert item["key"] == "ca.crt"
        assert mount["readOnly"] is True
    operator_container = _container(objs, "operator")
    assert operator_container["livenessProbe"]["periodSeconds"] == 31
    assert operator_container["livenessProbe"]["failureThreshold"] == 4
    assert operator_container["readinessProbe"]["periodSeconds"] == 11
    assert operator_container["resources"]["requests"] == {"cpu": "70m", "memory": "100Mi"}
    delivery_container = _container(objs, "delivery")
    assert delivery_container["livenessProbe"]["periodSeconds"] == 29
    assert delivery_container["readinessProbe"]["periodSeconds"] == 6
    assert delivery_container["readinessProbe"]["timeoutSeconds"] == 2


def _one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (obj,) = [o for o in objs if o["kind"] == kind]
    return obj


def test_the_webhook_is_served_by_the_operator_with_a_certificate_its_configuration_trusts(
    helm_bin: str, tmp_path: Path
) -> None:
    """The generated CA in the Secret is the configuration's caBundle, it signed the serving
    certificate, and that certificate names the webhook Service as the API server calls it;
    the operator serves on the port the Service targets, from the Secret's files."""
    objs = template(helm_bin, release="r", namespace="storage")
    config = _one(objs, "ValidatingWebhookConfiguration")
    (hook,) = config["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"
    assert hook["rules"] == [
        {
            "apiGroups": ["bucketnotify.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["topics", "bucketnotifications"],
            "scope": "Namespaced",
        }
    ]
    assert "namespaceSelector" not in hook, "watchNamespaces empty: every namespace"
    service_ref = hook["clientConfig"]["service"]
    assert (service_ref["namespace"], service_ref["path"]) == ("storage", "/validate")
    secret = _one(objs, "Secret")
    assert secret["type"] == "kubernetes.io/tls"
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (tmp_path / key).write_bytes(base64.b64decode(secret["data"][key]))
    host = f"{service_ref['name']}.storage.svc"
    verified = subprocess.run(
        ["openssl", "verify", "-CAfile", "ca.crt", "-verify_hostname", host, "tls.crt"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr

    (service,) = [
        o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == service_ref["name"]
    ]
    assert service["spec"]["ports"] == [
        {"name": "webhook", "port": service_ref["port"], "targetPort": "webhook"}
    ]
    container = _container(objs, "operator")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = _env(objs, "operator")
    assert int(env["BUCKETNOTIFY_WEBHOOK_PORT"]) == ports["webhook"] == 9443
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "webhook-tls"]
    assert mount["mountPath"] == env["BUCKETNOTIFY_WEBHOOK_CERT_DIR"]
    volumes = {v["name"]: v for v in container["pod"]["volumes"]}
    assert volumes["webhook-tls"]["secret"]["secretName"] == secret["metadata"]["name"]


def test_webhook_values(helm_bin: str) -> None:
    """Off: nothing of it is rendered and the operator serves none. A Secret of one's own
    needs its CA. watchNamespaces limit it to those namespaces; failurePolicy is passed on."""
    off = template(helm_bin, sets=["webhook.enabled=false"])
    assert not {"ValidatingWebhookConfiguration", "Secret"} & kinds(off)
    assert _env(off, "operator")["BUCKETNOTIFY_WEBHOOK_PORT"] == "0"
    assert "webhook" not in {p["name"] for p in _container(off, "operator")["ports"]}

    no_ca = helm(
        helm_bin, "template", "x", str(CHART), "--set", "webhook.certificate.generate=false",
        check=False,
    )  # fmt: skip
    assert no_ca.returncode != 0
    assert "webhook.certificate.caBundle" in no_ca.stderr

    own = template(
        helm_bin,
        sets=[
            "webhook.certificate.generate=false",
            'webhook.certificate.secretName="made-by-cert-manager"',
            'webhook.certificate.caBundle="Q0E="',
            'webhook.failurePolicy="Fail"',
            'watchNamespaces=["team-a","team-b"]',
        ],
    )
    assert "Secret" not in kinds(own)
    (hook,) = _one(own, "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["clientConfig"]["caBundle"] == "Q0E="
    assert hook["failurePolicy"] == "Fail"
    assert hook["namespaceSelector"] == {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "In",
                "values": ["team-a", "team-b"],
            }
        ]
    }
    volumes = {v["name"]: v for v in _container(own, "operator")["pod"]["volumes"]}
    assert volumes["webhook-tls"]["secret"]["secretName"] == "made-by-cert-manager"


APISERVER_WEBHOOK_SERIES = {
    "apiserver_admission_webhook_fail_open_count",
    "apiserver_admission_webhook_rejection_count",
}
"""The kube-apiserver's own series of its calls to admission webhooks (Kubernetes 1.24+)."""


def test_alerts_ask_series_we_export_and_servicemonitors_keep_our_namespace_label(
    helm_bin: str, all_options: str
) -> None:
    """Each alert of the PrometheusRule parses and asks only series the operator or the
    delivery service export, scoped to the Topic (``namespace``, ``topic``) where they
    count events. The ServiceMonitors honour our labels: otherwise Prometheus renames the
    Topic's ``namespace`` label to ``exported_namespace`` and every alert and dashboard
    panel groups by the pod's namespace instead."""
    objs = template(helm_bin, values=[all_options])
    (rule,) = [o for o in objs if o["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "prom"
    alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    assert {
        "BucketNotifyEventsLost",
        "BucketNotifyEndpointFailing",
        "BucketNotifyQueueGrowing",
        "BucketNotifyDeadLettersGrowing",
        "BucketNotifyPartitionsUnowned",
        "BucketNotifyReconcileErrors",
        "BucketNotifyOperatorNotLeading",
        "BucketNotifyWebhookFailing",
    } == set(alerts)
    exported = our_series() | APISERVER_WEBHOOK_SERIES
    for name, alert in alerts.items():
        asked = metric_names(alert["expr"])
        assert asked and asked <= exported, f"{name}: {asked - exported}"
        assert alert["labels"]["severity"] in {"warning", "critical"}
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
    for name in ("BucketNotifyEventsLost", "BucketNotifyEndpointFailing"):
        assert "by (namespace, topic)" in alerts[name]["expr"], name
    for name in ("BucketNotifyQueueGrowing", "BucketNotifyDeadLettersGrowing"):
        assert "by (namespace, topic)" in alerts[name]["expr"], name
    assert 'namespace="bucketnotify"' in alerts["BucketNotifyPartitionsUnowned"]["expr"]
    assert 'namespace="bucketnotify"' in alerts["BucketNotifyOperatorNotLeading"]["expr"]
    monitors = [o for o in objs if o["kind"] == "ServiceMonitor"]
    assert len(monitors) == 2
    for monitor in monitors:
        assert all(e["honorLabels"] is True for e in monitor["spec"]["endpoints"])


def test_an_upgrade_reusing_the_previous_releases_values_renders(
    helm_bin: str, tmp_path: Path
) -> None:
    """`helm upgrade --reuse-values` renders our templates with the previous release's
    values alone: a value added since has no default then, and a template that reads it
    unguarded fails the upgrade (a PrometheusRule template did: "nil pointer evaluating
    interface {}.enabled"). Rendered here as helm does it, with the chart's values.yaml
    replaced by the previous release's."""
    chart = tmp_path / "bucketnotify"
    shutil.copytree(CHART, chart)
    previous = subprocess.run(
        ["git", "show", f"{PREVIOUS_RELEASE}:charts/bucketnotify/values.yaml"],
        cwd=CHART,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (chart / "values.yaml").write_text(previous)
    for options in ([], ["--set", "metrics.prometheusRule.enabled=true"]):
        args = ["template", "x", str(chart), *options]
        rendered = helm(helm_bin, *args, check=False)
        assert rendered.returncode == 0, rendered.stderr
        assert "kind: Deployment" in rendered.stdout
    assert "kind: PrometheusRule" in rendered.stdout and "for: 10m" in rendered.stdout
    # A setting rendered from a value the previous release lacks must not come out empty:
    # an empty BUCKETNOTIFY_*_SECONDS stops the program at start (an upgrade hung on it).
    ours = template(helm_bin)
    reused = load_all(helm(helm_bin, "template", BASE_RELEASE, str(chart)).stdout)
    for component in ("operator", "delivery"):
        emptied = {
            k
            for k, v in _env(reused, component).items()
            # A value that renders as nothing is YAML's null: Kubernetes sets it empty.
            if v in (None, "") and _env(ours, component).get(k) not in (None, "")
        }
        assert not emptied, f"{component}: empty with the previous release's values: {emptied}"


def test_delivery_pods_take_pushes_on_8085_spread_over_nodes_and_stop_in_time(
    helm_bin: str,
) -> None:
    """The defaults README.md states for the delivery service: the ingest Service on 8085
    (the port the programs listen on), pods kept apart by node where the scheduler can, a
    preStop pause (the Service stops sending them events first) and 30 s of grace, more
    than that pause plus the drain, the running rounds and the Leases' hand-back need."""
    objs = template(helm_bin)
    delivery = _container(objs, "delivery")
    pod = delivery["pod"]
    (service,) = [
        o for o in objs if o["kind"] == "Service" and o["metadata"]["name"].endswith("-delivery")
    ]
    (port,) = service["spec"]["ports"]
    listening = {p["name"]: p["containerPort"] for p in delivery["ports"]}
    assert port["port"] == 8085
    assert listening[port["targetPort"]] == 8085
    assert _env(objs, "delivery")["BUCKETNOTIFY_DELIVERY_LISTEN_PORT"] == "8085"
    (preferred,) = pod["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    term = preferred["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == service["spec"]["selector"]
    pause = delivery["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pause == 5
    assert pod["terminationGracePeriodSeconds"] == 30
    # What is left after the pause and the drain is the rounds' and the Leases' time.
    assert pod["terminationGracePeriodSeconds"] - pause - DRAIN_MAX_S >= 20
