"""Is the Topic delivering? Its ``Delivering`` condition, ``status.delivery`` and printer
columns, from kubectl, while a real endpoint refuses and after it takes events again.

Real everything: the operator and a delivery replica as subprocesses (their health report
and status intervals 2 s), the apiserver, Ceph RGW handing events to the ingest (hand-off
sync), the local-directory queue store, an HTTP endpoint that answers 503 and then 200.
"""

from __future__ import annotations

import collections
import json
import re
import time
import uuid
from typing import Any

import pytest
import yaml

from bucketnotify.delivery.model.event import shard_of
from bucketnotify.delivery.model.queue import QueueName
from bucketnotify.delivery.peers.ownership import partition_of
from devstack.servers.recording import RecordingHttpServer
from tests.delivery import StartCluster, sync_topics
from tests.kubectl import Kubectl
from tests.localservices import REPO, LocalService
from tests.operator import HEALTH_INTERVAL_S, StartOperator
from tests.processes import Program
from tests.resources import apply, condition, object_events
from tests.s3 import s3_client
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")

FAILING_AFTER_S = 6
"""The threshold of the tests other than the worked example (which has its own)."""
DAY_TWO = REPO / "docs" / "day-two.md"


def worked_example() -> dict[str, Any]:
    """The Topic of docs/day-two.md's worked example (its one YAML block)."""
    found = re.search(r"```yaml\n(.*?)```", DAY_TWO.read_text(), re.DOTALL)
    assert found, "docs/day-two.md has no YAML block"
    topic: dict[str, Any] = yaml.safe_load(found[1])
    return topic


PASSWORD = "hunter2-in-the-url"


@pytest.fixture()
def replica_settings() -> dict[str, str]:
    # The survey that counts the backlog: every 2 s instead of 30; retries every second.
    return {"STATS_INTERVAL_SECONDS": "2"}


def delivering(kubectl: Kubectl, namespace: str, topic: str) -> dict[str, Any]:
    status: dict[str, Any] = kubectl.get("topic", topic, namespace).get("status") or {}
    return status


def condition_of(status: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = next(
        (c for c in status.get("conditions", []) if c["type"] == "Delivering"), {}
    )
    return found


def wait_delivering(
    kubectl: Kubectl,
    namespace: str,
    topic: str,
    status: str,
    reason: str,
    timeout: float,
    backlog: int | None = None,
) -> dict[str, Any]:
    """Until the Topic's Delivering condition is ``status`` (``reason``), and its
    ``status.delivery.backlogEvents`` is ``backlog`` if given; its status."""

    def done(st: dict[str, Any]) -> bool:
        got = condition_of(st)
        return (
            got.get("status") == status
            and got.get("reason") == reason
            and (backlog is None or st.get("delivery", {}).get("backlogEvents") == backlog)
        )

    return wait_until(
        lambda: delivering(kubectl, namespace, topic),
        done,
        timeout,
        f"topic {topic} Delivering={status} ({reason}), backlog {backlog}",
    )


def printed(kubectl: Kubectl, namespace: str, topic: str, wide: bool = False) -> dict[str, str]:
    """The Topic's row of ``kubectl get topics``, by column name."""
    args = ["get", "topics", topic, "-n", namespace] + (["-o", "wide"] if wide else [])
    header, row = kubectl.run(*args).stdout.splitlines()[:2]
    # Columns are separated by two or more spaces; a cell never holds two in a row.
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    names = header.split()
    cells = [row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    return dict(zip(names, cells, strict=True))


def test_the_worked_example_a_refusing_endpoint_turns_delivering_false_and_back(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    replica: tuple[Program, int],
    rgw: LocalService,
) -> None:
    start_operator(ingest_url=f"http://127.0.0.1:{replica[1]}")
    s3 = s3_client(rgw)
    bucket = f"dh-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    example = worked_example()
    spec = example["spec"]
    failing_after = spec["delivery"]["failingAfter"]
    with RecordingHttpServer(keep_alive=False) as endpoint:
        # The example's Topic, its endpoint here, with a credential in the URL's query that
        # must never show.
        spec["endpoint"]["http"]["url"] = f"{endpoint.url}/hook?access_token={PASSWORD}"
        topic = example["metadata"]["name"]
        apply(kubectl, namespace, "Topic", topic, spec)
        condition(kubectl, namespace, "topic", topic)
        apply(
            kubectl,
            namespace,
            "BucketNotification",
            "n",
            {"bucket": bucket, "topicRef": {"name": topic}, "testEvent": False},
        )
        condition(kubectl, namespace, "bucketnotification", "n")
        # Served, nothing pending: from the replica's report.
        wait_delivering(kubectl, namespace, topic, "True", "Delivering", 30, backlog=0)

        endpoint.status = 503
        refused_at = time.time()
        for key in ("a", "b", "c"):
            s3.put_object(Bucket=bucket, Key=key, Body=b"x")
        # Within the threshold plus a report, a status round and their slack.
        bound = failing_after + 4 * HEALTH_INTERVAL_S + 15
        status = wait_delivering(kubectl, namespace, topic, "False", "EndpointFailing", bound)
        took = time.time() - refused_at
        assert took >= failing_after, f"turned after {took:.1f} s, before the threshold"
        delivery = status["delivery"]
        assert "503" in delivery["lastFailureReason"], delivery
        assert "503" in condition_of(status)["message"]
        # The backlog: the survey counts it (every 2 s here).
        status = wait_until(
            lambda: delivering(kubectl, namespace, topic),
            lambda st: st.get("delivery", {}).get("backlogEvents") == 3,
            20,
            "the backlog of 3 in status.delivery",
        )
        oldest = status["delivery"]["oldestPendingTime"]
        assert oldest <= time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), oldest
        row = printed(kubectl, namespace, topic)
        assert (row["DELIVERING"], row["BACKLOG"]) == ("False", "3"), row
        assert row["OLDEST"] not in ("", "<none>"), row
        wide = printed(kubectl, namespace, topic, wide=True)
        assert wide["DELIVERY"] == "EndpointFailing", wide

        endpoint.status = 200
        status = wait_delivering(kubectl, namespace, topic, "True", "Delivering", 60, backlog=0)
        assert status["delivery"].get("backlogEvents") == 0, status["delivery"]
        assert "oldestPendingTime" not in status["delivery"]
        row = printed(kubectl, namespace, topic)
        # kubectl prints an absent date as nothing.
        assert (row["DELIVERING"], row["BACKLOG"], row["OLDEST"]) == ("True", "0", ""), row
        delivered = [r for r in endpoint.received() if r.status == 200]
        keys = sorted(json.loads(r.body)["Records"][0]["s3"]["object"]["key"] for r in delivered)
        assert keys == ["a", "b", "c"]

        events = object_events(kubectl, namespace, "Topic", topic)
        reasons = {e["reason"] for e in events}
        assert {"DeliveryStopped", "DeliveryResumed"} <= reasons, reasons
        stopped = next(e for e in events if e["reason"] == "DeliveryStopped")
        assert stopped["type"] == "Warning" and "EndpointFailing" in stopped["message"]
        # The spec holds the URL (and so does the status's copy of it, kopf's diff base):
        # what this feature writes must not.
        final = delivering(kubectl, namespace, topic)
        reports = kubectl.run(
            "get", "configmaps", "-n", namespace, "-l", "bucketnotify.io/delivery-health"
        ).stdout
        assert "health-" in reports, "the replica's report"
        seen = json.dumps([events, final["delivery"], final["conditions"]])
        seen += kubectl.run(
            "get",
            "configmaps",
            "-n",
            namespace,
            "-l",
            "bucketnotify.io/delivery-health",
            "-o",
            "json",
        ).stdout
        assert PASSWORD not in seen, "a credential in an Event, the status or a report"


def test_a_topic_the_gateway_pushes_says_unknown(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator()
    with RecordingHttpServer() as endpoint:
        apply(kubectl, namespace, "Topic", "pushed", {"endpoint": {"http": {"url": endpoint.url}}})
        condition(kubectl, namespace, "topic", "pushed")
        status = wait_delivering(kubectl, namespace, "pushed", "Unknown", "GatewayDelivers", 30)
        assert "delivery" not in status
        assert printed(kubectl, namespace, "pushed")["DELIVERING"] == "Unknown"


def test_no_replica_says_so(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    """A persistent Topic nobody delivers (no replica runs): False, NoReplica."""
    start_operator(ingest_url="http://127.0.0.1:9")
    with RecordingHttpServer() as endpoint:
        apply(
            kubectl,
            namespace,
            "Topic",
            "orphan",
            {"endpoint": {"http": {"url": endpoint.url}}, "persistent": True},
        )
        condition(kubectl, namespace, "topic", "orphan")
        status = wait_delivering(kubectl, namespace, "orphan", "False", "NoReplica", 30)
        assert "delivery service" in condition_of(status)["message"]


def test_with_two_replicas_and_after_each_is_killed(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    delivery_cluster: StartCluster,
    rgw: LocalService,
) -> None:
    """The Topic's shards spread over two replicas, each reporting its own: the status is
    the whole Topic's. One killed (SIGKILL), the other takes its partitions and the status
    still says what the endpoint does; both killed, nobody serves it: NoReplica."""
    cluster = delivery_cluster("dir")
    cluster.start("replica-a", stats_interval_seconds="2")
    cluster.start("replica-b", stats_interval_seconds="2")
    wait_until(
        cluster.holders,
        lambda h: sorted(collections.Counter(h.values()).values()) == [16, 16],
        30,
        "32 partitions spread 16/16 over two replicas",
    )
    start_operator(ingest_url=f"http://127.0.0.1:{cluster.ports['replica-a']}")
    s3 = s3_client(rgw)
    with RecordingHttpServer(status=503, keep_alive=False) as endpoint:
        buckets = sync_topics(
            kubectl,
            namespace,
            s3,
            {
                "spread": (
                    endpoint,
                    {
                        "retrySleepDuration": 1,
                        "delivery": {"handoff": "sync", "failingAfter": FAILING_AFTER_S},
                    },
                )
            },
        )
        keys = [f"k{i}" for i in range(12)]
        queue = QueueName(namespace, "spread")
        owners = {
            cluster.holders()[partition_of(queue, shard_of(buckets["spread"], key, 11), 32)]
            for key in keys
        }
        assert owners == {"replica-a", "replica-b"}, "the keys' shards on both replicas"
        for key in keys:
            s3.put_object(Bucket=buckets["spread"], Key=key, Body=b"x")
        bound = FAILING_AFTER_S + 4 * HEALTH_INTERVAL_S + 15
        wait_delivering(kubectl, namespace, "spread", "False", "EndpointFailing", bound)
        backlog = wait_until(
            lambda: delivering(kubectl, namespace, "spread"),
            lambda st: st.get("delivery", {}).get("backlogEvents") == len(keys),
            20,
            "the whole Topic's backlog",
        )
        assert backlog["delivery"]["retrying"] == len(keys), "both replicas' shards counted"

        cluster.kill("replica-b")
        wait_until(
            cluster.holders,
            lambda h: set(h.values()) == {"replica-a"} and len(h) == 32,
            40,
            "replica-a holds every partition",
        )
        # Its report written on the take, the shards are served again: still failing.
        wait_delivering(kubectl, namespace, "spread", "False", "EndpointFailing", 20)

        endpoint.status = 200
        status = wait_delivering(kubectl, namespace, "spread", "True", "Delivering", 60, backlog=0)
        assert status["delivery"]["backlogEvents"] == 0
        got = {
            record["s3"]["object"]["key"]
            for request in endpoint.received()
            if request.status == 200
            for record in json.loads(request.body)["Records"]
        }
        assert got == set(keys)

        cluster.kill("replica-a")
        # Its report goes stale after two intervals and the slack: nobody serves the Topic.
        wait_delivering(
            kubectl, namespace, "spread", "False", "NoReplica", 2 * HEALTH_INTERVAL_S + 15 + 20
        )
