"""The chart on a real one-node cluster: our image runs as pods, as our users run it.

One release serves the module (installing it costs a minute): the previous release,
upgraded to ours under a stream of uploads (the fixture `release`), checked by the first
test. The tests run in file order and the last one uninstalls it.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import signal
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack.servers.recording import keys_of
from tests.cluster.pods import (
    Release,
    container_processes,
    describe,
    describe_all,
    pods,
    ready,
)
from tests.cluster.uploads import API, Uploads, notified_bucket
from tests.faults.bounds import KILL_REPEAT_WINDOW_S, LATE_COPY_SWEEP_S
from tests.install.manifests import helm
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.s3 import s3_client, sns_client
from tests.waiting import wait_until

SPARK_DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "spark"
pytestmark = pytest.mark.usefixtures("release")


def test_an_upgrade_from_the_previous_release_under_a_stream_loses_and_repeats_nothing(
    release: Release, receiver: Any
) -> None:
    """`helm upgrade` from the previous release's chart and image to ours rolled every pod
    while uploads to a Topic with hand-off sync went on: each acknowledged upload arrives,
    once (a refused push of hand-off sync is an upload lost, so none may be)."""
    upgrade = release.upgrade

    def arrived() -> list[str]:
        return [k for k in keys_of(receiver.received()) if k.startswith("upgrade/")]

    seen: list[str] = []
    wait_until(
        lambda: sorted(set(upgrade.acknowledged) - set(seen.extend(arrived()) or seen)),
        lambda missing: not missing,
        120,
        f"every upload acknowledged through the upgrade from {upgrade.previous}",
    )

    time.sleep(max(5, upgrade.last_ready + LATE_COPY_SWEEP_S - time.time()))  # late copies
    seen += arrived()
    counts = Counter(seen)
    print(
        f"through the upgrade from {upgrade.previous}: {len(upgrade.acknowledged)} acknowledged,"
        f" {len(upgrade.during)} of them in the {upgrade.last_ready - upgrade.began:.0f} s from"
        " `helm upgrade`"
        f" to the last new pod Ready, {len(counts)} delivered,"
        f" {sum(n - 1 for n in counts.values())} repeated, {len(upgrade.failed)} failed"
    )
    # The stream ran through the rolling update, not only before or after it.
    assert upgrade.during, "no upload was acknowledged while the pods rolled"
    assert not upgrade.failed, f"uploads refused through the upgrade: {upgrade.failed}"
    assert set(counts) == set(upgrade.acknowledged)
    assert all(n == 1 for n in counts.values()), "a graceful rolling update repeats nothing"


def test_every_pod_is_ready_and_the_operator_leads_under_its_pod_name(
    release: Release, ckubectl: Kubectl
) -> None:
    """The operator pod used to crash-loop (kopf asked the user database for uid 65532)."""
    operators = pods(ckubectl, release.namespace, "operator")
    deliveries = pods(ckubectl, release.namespace, "delivery")
    assert len(operators) == 2 and len(deliveries) == 3
    for pod in operators + deliveries:
        assert ready(pod), describe(ckubectl, release.namespace)
        (container,) = pod["spec"]["containers"]
        assert container["image"] == release.upgrade.image
        (status,) = pod["status"]["containerStatuses"]
        assert status["restartCount"] == 0, describe(ckubectl, release.namespace)
    # The upgrade replaced the operator pods: one of the new ones leads within a Lease.
    names = {p["metadata"]["name"] for p in operators}
    wait_until(
        lambda: ckubectl.get("lease", "bucketnotify-operator", release.namespace)["spec"].get(
            "holderIdentity"
        ),
        lambda holder: holder in names,
        40,
        "an operator pod of the release leading, under its pod name",
    )
    members = json.loads(
        ckubectl.run(
            "get",
            "leases",
            "-n",
            release.namespace,
            "-l",
            "bucketnotify.io/lease-role=member",
            "-o",
            "json",
        ).stdout
    )["items"]
    assert sorted(m["spec"]["holderIdentity"] for m in members) == sorted(
        p["metadata"]["name"] for p in deliveries
    )


def test_kubectl_apply_is_checked_by_the_operator_pods_webhook(
    release: Release, ckubectl: Kubectl
) -> None:
    """The chart's webhook configuration, Service and generated certificate work together:
    the API server calls the operator pods, which refuse a key regex the gateway cannot
    compile and warn about a Topic that does not exist."""
    ns = release.namespace

    def notification(name: str, regex: str) -> dict[str, Any]:
        return {
            "apiVersion": API,
            "kind": "BucketNotification",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "bucket": "never-written",
                "topicRef": {"name": "not-yet"},
                "filter": {"key": {"regex": regex}},
            },
        }

    refused = ckubectl.apply(notification("bad-regex", "(?>a)"), check=False)
    assert refused.returncode != 0
    assert 'admission webhook "validate.bucketnotify.io" denied the request' in refused.stderr
    assert "outside the gateway's regex dialect" in refused.stderr
    warned = ckubectl.apply(notification("early", "^a"), check=False)
    assert warned.returncode == 0, warned.stderr
    assert f"Warning: spec.topicRef: Topic {ns}/not-yet does not exist (yet)" in warned.stderr
    ckubectl.run("delete", "bucketnotification", "early", "-n", ns, "--wait=false")


@pytest.fixture(scope="module")
def bucket(release: Release, ckubectl: Kubectl, rgw: LocalService, receiver: Any) -> str:
    """A persistent Topic to ``receiver`` and a BucketNotification on a new bucket, applied
    with kubectl and Ready."""
    name = f"cluster-{uuid.uuid4().hex[:6]}"
    ns = release.namespace
    spec = {
        "name": f"{ns}-webhook",
        "endpoint": {"http": {"url": receiver.url}},
        "persistent": True,
        "delivery": {"handoff": "persistent", "shards": 4},
    }
    notified_bucket(ckubectl, rgw, ns, name, "webhook", spec, "uploads")
    return name


def test_helm_test_proves_the_release_works(
    release: Release, helm_bin: str, node: LocalService, ckubectl: Kubectl
) -> None:
    """``helm test``: the chart's hook pod runs ``bucketnotify release check`` as a
    ServiceAccount of its own: the operator leads, its webhook refuses what it should, a
    throw-away Topic becomes Ready on the gateway and is gone after its delete."""
    # No --logs: the pod of a passed test is deleted at once (hook-succeeded), so there are
    # none to read; it passes only if every check its arguments ask for did.
    result = helm(
        helm_bin, "test", release.name, "-n", release.namespace,
        "--kubeconfig", node["NODE_KUBECONFIG"], "--timeout", "5m",
        check=False,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, f"{out}\n{describe(ckubectl, release.namespace)}"
    pod = ckubectl.run("get", "pod", f"{release.name}-bucketnotify-release-check",
                       "-n", release.namespace, check=False)  # fmt: skip
    assert pod.returncode != 0, "a passed test's pod is not left behind"
    topics = ckubectl.run("get", "topics", "-n", release.namespace, "-o", "name").stdout
    assert "release-check" not in topics, "the throw-away Topic is gone"


def test_uploads_reach_the_endpoint_through_the_pods_once_each(
    rgw: LocalService, bucket: str, receiver: Any
) -> None:
    s3 = s3_client(rgw)
    keys = [f"first/{i:03d}" for i in range(20)]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    seen: list[str] = []
    wait_until(
        lambda: seen.extend(keys_of(receiver.received())) or seen,
        lambda s: set(keys) <= set(s),
        60,
        "every upload at the endpoint",
    )
    time.sleep(5)  # anything sent twice arrives within this
    seen += keys_of(receiver.received())
    assert Counter(seen) == Counter(keys)


def test_the_last_of_twenty_watched_namespaces_reconciles_and_delivers(
    release: Release, ckubectl: Kubectl, rgw: LocalService, receiver: Any
) -> None:
    """The release watches 20 namespaces (kopf: 60 watch streams, each holding a connection
    of its pool): a Topic and a BucketNotification in the last one become Ready and an
    upload there reaches the endpoint through the pods. A pool that did not count the
    streams stalled from 8 namespaces on and reconciled nothing."""
    ns = release.watched[-1]
    bucket = f"last-{uuid.uuid4().hex[:6]}"
    s3 = s3_client(rgw)
    spec = {
        "name": f"{ns}-t",
        "endpoint": {"http": {"url": f"{receiver.url}/last"}},
        "persistent": True,
        "delivery": {"handoff": "sync"},
    }
    notified_bucket(ckubectl, rgw, ns, bucket, "t", spec, "n")
    s3.put_object(Bucket=bucket, Key="from-the-last-namespace", Body=b"x")
    seen: list[str] = []
    wait_until(
        lambda: seen.extend(keys_of(receiver.received())) or seen,
        lambda s: "from-the-last-namespace" in s,
        60,
        "the upload of the last watched namespace at the endpoint",
    )
    ckubectl.run("delete", "bucketnotifications,topics", "--all", "-n", ns, "--wait=true")


def test_pods_deleted_under_a_stream_lose_no_acknowledged_event(
    release: Release, ckubectl: Kubectl, rgw: LocalService, bucket: str, receiver: Any
) -> None:
    """kubectl delete of the delivery pod holding most partitions, then of the operator's
    leader pod (another pod leads), under a steady stream of uploads: every acknowledged
    upload arrives, once (a pod deleted stops gracefully and hands its Leases back). A
    rolling update under hand-off sync: the first test; processes killed: the next."""
    ns = release.namespace
    seen: list[str] = []
    with Uploads(rgw, bucket, "stream") as uploads:
        time.sleep(5)
        holders = Counter(
            lease["spec"].get("holderIdentity")
            for lease in json.loads(
                ckubectl.run(
                    "get", "leases", "-n", ns, "-l", "bucketnotify.io/lease-role=partition",
                    "-o", "json",
                ).stdout
            )["items"]
        )  # fmt: skip
        busiest, _ = holders.most_common(1)[0]
        ckubectl.run("delete", "pod", "-n", ns, busiest, "--wait=true")
        leader = ckubectl.get("lease", "bucketnotify-operator", ns)["spec"]["holderIdentity"]
        ckubectl.run("delete", "pod", "-n", ns, leader, "--wait=true")
        wait_until(
            lambda: (
                ckubectl.get("lease", "bucketnotify-operator", ns)["spec"].get("holderIdentity"),
                {p["metadata"]["name"] for p in pods(ckubectl, ns, "operator")},
            ),
            lambda seen: seen[0] != leader and seen[0] in seen[1],
            120,
            "another operator pod leading",
        )
        deleted = time.time()
        time.sleep(5)
    acknowledged = uploads.acknowledged
    wait_until(
        lambda: sorted(set(acknowledged) - set(seen.extend(keys_of(receiver.received())) or seen)),
        lambda missing: not missing,
        180,
        "every acknowledged upload at the endpoint",
    )
    time.sleep(max(5, deleted + LATE_COPY_SWEEP_S - time.time()))  # late copies
    seen += [k for k in keys_of(receiver.received())]
    counts = Counter(k for k in seen if k.startswith("stream/"))
    print(f"{len(acknowledged)} acknowledged, {len(counts)} delivered")
    assert len(acknowledged) > 50  # the stream ran through the deletions
    assert set(acknowledged) <= set(counts)
    assert [k for k, n in counts.items() if n > 1] == [], "a graceful stop repeats nothing"


KILLED_WRITERS = 4
HELD_S = 0.5
"""How long the pods stay frozen before the kill: an upload unanswered for half of it waits
on them (a push takes milliseconds otherwise)."""


def test_delivery_processes_killed_with_sigkill_lose_only_the_uploads_they_held(
    release: Release, ckubectl: Kubectl, rgw: LocalService, receiver: Any
) -> None:
    """Every delivery container's process is killed with SIGKILL through the node (what an
    OOM kill or a crash does; `kubectl delete --force` still sends SIGTERM first), with
    hand-off sync uploads waiting on them: the processes are frozen first (SIGSTOP), the
    uploads that then wait are the ones in flight, and only then comes the SIGKILL. The
    stream stops there (while no pod is up, hand-off sync loses every upload: the gateway
    counts a refused push as done, docs/operator.md) and the kubelet restarts the
    containers; a second stream runs once they are Ready. Every upload acknowledged and
    not in flight at the kill arrives exactly once, so does every upload of the second
    stream; one in flight at the kill at most once; one refused at most once. What the
    killed processes had pushed and not recorded may come again: at most
    KILL_REPEAT_WINDOW_S of the stream."""
    ns = release.namespace
    bucket = f"killed-{uuid.uuid4().hex[:6]}"
    spec = {
        "name": f"{ns}-killed",
        "endpoint": {"http": {"url": f"{receiver.url}/killed"}},
        "persistent": True,
        "delivery": {"handoff": "sync", "shards": 4},
    }
    notified_bucket(ckubectl, rgw, ns, bucket, "killed", spec, "killed")
    delivery = pods(ckubectl, ns, "delivery")
    restarts = {p["metadata"]["name"]: restart_count(p) for p in delivery}
    processes = [pid for pod in delivery for pid in container_processes(pod, "delivery")]
    assert len(processes) == len(delivery), f"one process per delivery pod: {processes}"
    with Uploads(rgw, bucket, "killed", writers=KILLED_WRITERS) as uploads:
        time.sleep(5)
        for pid in processes:
            os.kill(pid, signal.SIGSTOP)
        frozen = time.time()
        time.sleep(HELD_S)
        # Waiting this long, each waits on a frozen pod (a push takes milliseconds).
        held = uploads.unanswered(sent_before=time.time() - HELD_S / 2)
        for pid in processes:
            os.kill(pid, signal.SIGKILL)
        killed = time.time()
    stopped = time.time()  # each writer's last upload answered: lost or pushed
    print(f"froze and killed {processes}: {len(held)} uploads held: {held}")
    assert held, "no upload waited on the frozen pods: the kill would miss"
    wait_until(
        lambda: {
            p["metadata"]["name"]: (restart_count(p), ready(p))
            for p in pods(ckubectl, ns, "delivery")
        },
        lambda now: all(
            now.get(name, (0, False))[0] > n and now[name][1] for name, n in restarts.items()
        ),
        180,
        "every delivery container restarted and Ready",
    )
    with Uploads(rgw, bucket, "killed-after", writers=KILLED_WRITERS) as after:
        time.sleep(5)
    acknowledged = set(uploads.acknowledged)
    in_flight = {
        k
        for k in acknowledged
        if uploads.times[k][0] <= stopped and (uploads.times[k][1] or 0) >= frozen
    }
    must = (acknowledged - in_flight) | set(after.acknowledged)
    seen: list[str] = []

    def arrived() -> list[str]:
        seen.extend(
            k for k in keys_of(receiver.received()) if k.startswith(("killed/", "killed-after/"))
        )
        return seen

    wait_until(
        lambda: sorted(must - set(arrived())), lambda missing: not missing, 180,
        "every acknowledged upload not in flight at the kill",
    )  # fmt: skip
    time.sleep(max(5, killed + LATE_COPY_SWEEP_S - time.time()))  # late copies
    counts = Counter(arrived())
    repeated = sorted(k for k, n in counts.items() if n > 1)
    lost = sorted(in_flight - set(counts))
    print(
        f"{len(acknowledged)} acknowledged, {len(in_flight)} in flight at the kill ({len(lost)}"
        f" of them lost), {len(uploads.failed)} refused, {len(counts)} delivered,"
        f" repeated: {repeated}"
    )
    assert len(acknowledged) > 50 and after.acknowledged  # streams before and after the kill
    made = acknowledged | set(uploads.failed) | set(after.acknowledged) | set(after.failed)
    assert set(counts) <= made, "events of uploads never made"
    assert len(repeated) <= int(KILLED_WRITERS * 10 * KILL_REPEAT_WINDOW_S), repeated
    for key in repeated:
        # Only what the killed processes had pushed and not recorded: acknowledged shortly
        # before the kill (a sync upload is answered once its event is pushed or queued),
        # or in flight at it; never one of the second stream.
        assert key in uploads.times, f"{key} of the stream after the restart arrived twice"
        answered = uploads.times[key][1] or 0
        assert key in in_flight or killed - KILL_REPEAT_WINDOW_S <= answered <= killed, (
            f"{key} arrived twice though answered {answered - killed:+.2f} s from the kill"
        )


def restart_count(pod: dict[str, Any]) -> int:
    return sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses", []))


def delivered_records(s3: Any, bucket: str, namespace: str, topic: str) -> Counter[str]:
    """The object keys of the ``delivered`` records of one Topic in the delivery records the
    replicas wrote to the gateway, counted."""
    keys: Counter[str] = Counter()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="records/v1/"):
        for obj in page.get("Contents", []):
            body = gzip.decompress(s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
            for line in body.decode().splitlines():
                record = json.loads(line)
                if (record["namespace"], record["topic"], record["outcome"]) == (
                    namespace,
                    topic,
                    "delivered",
                ):
                    keys[record["key"]] += 1
    return keys


def spark_application(
    name: str, image: str, arguments: list[str], apiserver: str
) -> dict[str, Any]:
    """deploy/spark/sparkapplication.yaml as a user applies it, with this run's image, days
    and places, and sizes a two-core node can schedule beside the release."""
    app: dict[str, Any] = yaml.safe_load((SPARK_DEPLOY / "sparkapplication.yaml").read_text())
    app["metadata"]["name"] = name
    spec = app["spec"]
    spec.update(image=image, imagePullPolicy="Never", arguments=arguments)
    # This node has no cluster DNS: the driver cannot resolve kubernetes.default.svc (its
    # default API server address) nor the executors the driver's Service name.
    spec["sparkConf"]["spark.kubernetes.driver.master"] = apiserver
    spec["sparkConf"]["spark.kubernetes.executor.useDriverPodIP"] = "true"
    for role in ("driver", "executor"):
        spec[role].update(memory="1g", coreRequest="250m")
    return app


def test_the_report_runs_under_the_spark_operator_and_counts_what_the_pods_delivered(
    release: Release,
    ckubectl: Kubectl,
    rgw: LocalService,
    receiver: Any,
    gateway_for_pods: Any,
    spark_image: str,
    spark_operator: str,
) -> None:
    """Uploads delivered by the delivery pods leave delivery records on the gateway; the
    SparkApplication of deploy/spark, run by the Spark operator in driver and executor pods,
    reads them through s3a and writes its Parquet, summary and HTML back to the gateway; the
    summary counts each upload of its Topic once, delivered, none lost."""
    ns = release.namespace
    s3 = s3_client(rgw)
    bucket = f"reported-{uuid.uuid4().hex[:6]}"
    spec = {"endpoint": {"http": {"url": receiver.url}}, "persistent": True}
    notified_bucket(ckubectl, rgw, ns, bucket, "reported", spec, "reported")
    keys = [f"report/{i:03d}" for i in range(30)]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    store = dict(v.split("=", 1) for v in release.values)["delivery.store.bucket"]
    # The replicas flush their records every few seconds (delivery.records.flushSeconds).
    wait_until(
        lambda: delivered_records(s3, store, ns, "reported"),
        lambda counted: set(counted) == set(keys),
        90,
        "a delivered record of every upload on the gateway",
    )
    assert delivered_records(s3, store, ns, "reported") == Counter(keys)

    ckubectl.run("apply", "-n", ns, "-f", str(SPARK_DEPLOY / "rbac.yaml"))
    ckubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "bucketnotify-gateway", "namespace": ns},
            "stringData": {
                "endpoint": gateway_for_pods.url,
                "accessKey": rgw["RGW_ACCESS_KEY"],
                "secretKey": rgw["RGW_SECRET_KEY"],
            },
        }
    )
    today = dt.datetime.now(dt.UTC).date()
    # Yesterday too: uploads just before midnight (UTC) have their records there.
    days = [f"--from={today - dt.timedelta(days=1)}", f"--to={today}"]
    output = f"s3a://{store}/reports-{uuid.uuid4().hex[:6]}"
    kubernetes = ckubectl.get("service", "kubernetes", "default")["spec"]["clusterIP"]
    app = spark_application(
        "report",
        spark_image,
        [f"--input=s3a://{store}/records", f"--output={output}", *days],
        f"https://{kubernetes}:443",
    )
    app["metadata"]["namespace"] = ns
    ckubectl.apply(app)
    started = time.monotonic()
    try:
        state = wait_until(
            lambda: (
                (ckubectl.get("sparkapplication", "report", ns).get("status") or {})
                .get("applicationState", {})
                .get("state")
            ),
            lambda s: s in ("COMPLETED", "FAILED", "SUBMISSION_FAILED"),
            900,
            "the SparkApplication to finish",
        )
    finally:
        took = time.monotonic() - started
        print(f"SparkApplication finished in {took:.0f} s")
        print(describe_all(ckubectl, ns)[-6000:])
        print(describe_all(ckubectl, spark_operator)[-3000:])
    status = ckubectl.get("sparkapplication", "report", ns).get("status")
    assert state == "COMPLETED", json.dumps(status, indent=1)
    # It ran in pods: the driver, and executors the operator saw (Spark deletes them at the
    # end; one the driver stops while it shuts down may be recorded FAILED though the
    # application COMPLETED, as a CI run saw, so their end state is not asserted).
    assert status["driverInfo"]["podName"] == "report-driver"
    assert status["executorState"], "no executor pod ran"

    prefix = output.removeprefix(f"s3a://{store}/")
    name = f"{today - dt.timedelta(days=1)}_{today}"
    summary = json.loads(
        s3.get_object(Bucket=store, Key=f"{prefix}/summary/{name}.json")["Body"].read()
    )
    [figures] = [t for t in summary["topics"] if (t["namespace"], t["topic"]) == (ns, "reported")]
    assert (figures["triggered"], figures["delivered"], figures["lost"]) == (
        len(keys),
        len(keys),
        0,
    )
    assert figures["duplicates_delivered"] == 0
    stored = {
        obj["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=store, Prefix=prefix)
        for obj in page.get("Contents", [])
    }
    assert any(k.startswith(f"{prefix}/hourly/date=") and k.endswith(".parquet") for k in stored)
    report = s3.get_object(Bucket=store, Key=f"{prefix}/report/{name}.html")["Body"].read()
    assert report.decode().lstrip().lower().startswith("<!doctype html>")


def test_a_namespace_deleted_whole_takes_its_gateway_objects_with_it(
    release: Release, ckubectl: Kubectl, rgw: LocalService
) -> None:
    """The finalizers remove the gateway topic and the notification Id, and the namespace
    (deleted by the controller-manager, which this cluster runs) goes away."""
    ns = f"{release.namespace}-apps"
    assert ns in release.watched  # made before the install, which put a Role in it
    s3 = s3_client(rgw)
    bucket = f"gone-{uuid.uuid4().hex[:6]}"
    topic_name = f"{ns}-t"
    spec = {"name": topic_name, "endpoint": {"http": {"url": "http://127.0.0.1:9/"}}}
    notified_bucket(ckubectl, rgw, ns, bucket, "t", spec, "n")
    assert s3.get_bucket_notification_configuration(Bucket=bucket).get("TopicConfigurations")

    ckubectl.run("delete", "namespace", ns, "--wait=false")
    wait_until(
        lambda: ckubectl.run("get", "namespace", ns, check=False).returncode,
        lambda rc: rc != 0,
        120,
        f"namespace {ns} gone",
    )
    assert not s3.get_bucket_notification_configuration(Bucket=bucket).get("TopicConfigurations")
    sns = sns_client(rgw)
    arns = [t["TopicArn"] for t in sns.list_topics()["Topics"]]
    assert not [a for a in arns if a.endswith(f":{topic_name}")]


def evict(kubectl: Kubectl, namespace: str, pod: str) -> str:
    """POST an Eviction, as `kubectl drain` does; "" when granted, else the refusal."""
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": namespace},
    }
    result = kubectl.run(
        "create",
        "--raw",
        f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction",
        "-f",
        "-",
        stdin=json.dumps(eviction),
        check=False,
    )
    return "" if result.returncode == 0 else result.stderr


def test_evictions_respect_the_pod_disruption_budget(release: Release, ckubectl: Kubectl) -> None:
    """A drain evicts the delivery pods one at a time: with one replica evicted and its
    successor not yet Ready, the chart's budget (maxUnavailable 1) refuses the next
    eviction; once the successor is Ready, the next is granted."""
    ns = release.namespace

    def ready_pods() -> list[str]:
        return sorted(p["metadata"]["name"] for p in pods(ckubectl, ns, "delivery") if ready(p))

    wanted = len(pods(ckubectl, ns, "delivery"))
    first, second, *_ = wait_until(ready_pods, lambda r: len(r) == wanted >= 2, 120, "all Ready")
    assert evict(ckubectl, ns, first) == ""
    refusal = evict(ckubectl, ns, second)
    assert "disruption budget" in refusal, refusal
    assert second in [p["metadata"]["name"] for p in pods(ckubectl, ns, "delivery")]
    # The successor Ready again: the budget allows one more (the controller recomputes it).
    wait_until(ready_pods, lambda r: len(r) == wanted and first not in r, 180, "successor Ready")
    wait_until(lambda: evict(ckubectl, ns, second), lambda refused: not refused, 60, "granted")
    wait_until(ready_pods, lambda r: len(r) == wanted and second not in r, 180, "all Ready")


def test_helm_uninstall_removes_the_release_and_its_namespace_goes(
    release: Release, helm_bin: str, node: LocalService, ckubectl: Kubectl, rgw: LocalService
) -> None:
    """The user deletes their Topics and notifications while the operator still runs (its
    finalizers clean the gateway), then uninstalls: nothing of the release is left and the
    namespace deletion completes. The CRDs and the queue bucket on the gateway (events not
    yet delivered, the delivery records) stay."""
    ns = release.namespace
    ckubectl.run(
        "delete", "bucketnotifications,topics", "--all", "-n", ns, "--wait=true", "--timeout=120s"
    )
    helm(
        helm_bin,
        "uninstall",
        release.name,
        "-n",
        ns,
        "--kubeconfig",
        node["NODE_KUBECONFIG"],
        "--wait",
        "--timeout",
        "3m",
    )
    instance = f"app.kubernetes.io/instance={release.name}"

    def left() -> list[str]:
        namespaced = ckubectl.run(
            "get",
            "deployments,pods,services,poddisruptionbudgets,serviceaccounts,roles,rolebindings,"
            "secrets,configmaps,networkpolicies",
            "-n",
            ns,
            "-l",
            instance,
            "-o",
            "name",
        ).stdout.split()
        cluster_wide = ckubectl.run(
            "get",
            "clusterroles,clusterrolebindings,validatingwebhookconfigurations",
            "-l",
            instance,
            "-o",
            "name",
        ).stdout.split()
        # The Leases the pods made carry no release label: all of the namespace's are ours
        # (the operator's leader Lease, 32 partition Leases, a member Lease per pod).
        made = ckubectl.run("get", "leases", "-n", ns, "-o", "name").stdout.split()
        roles = [
            f"{watched}: {found}"
            for watched in release.watched[2:]
            for found in ckubectl.run(
                "get", "roles,rolebindings", "-n", watched, "-l", instance, "-o", "name"
            ).stdout.split()
        ]
        return namespaced + cluster_wide + made + roles

    # The pods go with their ReplicaSets, in the background, after their grace period; the
    # Leases go with the Deployments that own them (the controller-manager's garbage
    # collector).
    wait_until(left, lambda objects: objects == [], 120, "nothing of the release left")
    # The CRDs stay (crds.keep), so the users' objects of other releases survive.
    for crd in ("topics.bucketnotify.io", "bucketnotifications.bucketnotify.io"):
        assert ckubectl.run("get", "crd", crd, check=False).returncode == 0, crd
    (queue_bucket,) = [
        v.split("=", 1)[1] for v in release.values if v.startswith("delivery.store.bucket=")
    ]
    s3_client(rgw).head_bucket(Bucket=queue_bucket)  # raises when it is gone
    ckubectl.run("delete", "namespace", ns, "--wait=false")
    wait_until(
        lambda: ckubectl.run("get", "namespace", ns, check=False).returncode,
        lambda rc: rc != 0,
        120,
        f"namespace {ns} gone",
    )
