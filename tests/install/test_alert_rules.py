"""The chart's alerts under ``promtool test rules`` (Prometheus' own rule evaluation, built
from its Go module by deploy/local/promtool.sh): each fires, with its labels and words,
when what it names happens, on series named and labelled as our processes export them
(``test_chart`` checks the names against their registries), and stays quiet otherwise."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.install.manifests import local_tool, template

NS = "bucketnotify"
"""The release namespace ``template`` renders into (the pods' ``namespace`` label)."""


@pytest.fixture(scope="session")
def promtool() -> str:
    """promtool from its Go module; a build that fails fails the test, it never skips."""
    try:
        return local_tool("promtool")
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


def alert(name: str, at: str, *firing: dict[str, Any]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": name, "exp_alerts": list(firing)}


def fired(labels: dict[str, str], summary: str, description: str) -> dict[str, Any]:
    return {
        "exp_labels": labels,
        "exp_annotations": {"summary": summary, "description": description},
    }


TOPIC = {"namespace": "shop", "topic": "orders"}

CASES: list[dict[str, Any]] = [
    {
        # Three events of shop/orders dropped at minute 5; shop/quiet loses none.
        "interval": "1m",
        "input_series": [
            {
                "series": 'pubsub_event_lost_total{namespace="shop",topic="orders"}',
                "values": "0 0 0 0 0 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3",
            },
            {"series": 'pubsub_event_lost_total{namespace="shop",topic="quiet"}', "values": "0x22"},
        ],
        "alert_rule_test": [
            alert("BucketNotifyEventsLost", "4m"),
            alert(
                "BucketNotifyEventsLost",
                "10m",
                fired(
                    {"severity": "critical", **TOPIC},
                    "Events of Topic shop/orders were dropped undelivered",
                    "3 events of the last 10 minutes passed timeToLive or maxRetries, or"
                    " the endpoint refused them for good, and the Topic has no"
                    " deadLetterTopic. Their delivery records (outcome lost) name bucket and"
                    " key.",
                ),
            ),
            alert("BucketNotifyEventsLost", "22m"),
        ],
    },
    {
        # shop/orders: every push fails from the start; shop/flaky: some fail, some succeed.
        "interval": "1m",
        "input_series": [
            {
                "series": 'pubsub_push_failed_total{namespace="shop",topic="orders"}',
                "values": "0+6x30",
            },
            {"series": 'pubsub_push_ok_total{namespace="shop",topic="orders"}', "values": "0x30"},
            {
                "series": 'pubsub_push_failed_total{namespace="shop",topic="flaky"}',
                "values": "0+6x30",
            },
            {"series": 'pubsub_push_ok_total{namespace="shop",topic="flaky"}', "values": "0+60x30"},
        ],
        "alert_rule_test": [
            alert("BucketNotifyEndpointFailing", "8m"),
            alert(
                "BucketNotifyEndpointFailing",
                "20m",
                fired(
                    {"severity": "warning", **TOPIC},
                    "Every push of Topic shop/orders fails",
                    "No push succeeded for 10m; events wait in the queue until timeToLive."
                    " The Topic's Events and the delivery service's log name the endpoint's"
                    " answer.",
                ),
            ),
        ],
    },
    {
        # shop/orders grows for an hour; shop/steady holds 500 entries that do not grow.
        "interval": "1m",
        "input_series": [
            {
                "series": 'persistent_topic_len{namespace="shop",topic="orders"}',
                "values": "0+10x60",
            },
            {"series": 'persistent_topic_len{namespace="shop",topic="steady"}', "values": "500x60"},
        ],
        "alert_rule_test": [
            alert("BucketNotifyQueueGrowing", "20m"),
            alert(
                "BucketNotifyQueueGrowing",
                "60m",
                fired(
                    {"severity": "warning", **TOPIC},
                    "The queue of Topic shop/orders keeps growing",
                    "600 entries and rising for 30m: the endpoint is slower than the"
                    " uploads, or failing.",
                ),
            ),
        ],
    },
    {
        # shop/orders keeps 5 more dead letters every minute from minute 10; shop/kept holds
        # 40 that were kept long ago and do not grow.
        "interval": "1m",
        "input_series": [
            {
                "series": 'bucketnotify_dead_letters{namespace="shop",topic="orders"}',
                "values": "0x10 5+5x50",
            },
            {
                "series": 'bucketnotify_dead_letters{namespace="shop",topic="kept"}',
                "values": "40x60",
            },
        ],
        "alert_rule_test": [
            alert("BucketNotifyDeadLettersGrowing", "20m"),
            alert(
                "BucketNotifyDeadLettersGrowing",
                "40m",
                fired(
                    {"severity": "warning", **TOPIC},
                    "Dead letters of Topic shop/orders keep growing",
                    "150 dead letters kept and more in the last 30 minutes: events expire or"
                    " are refused. Fix the endpoint, then list and redrive them (bucketnotify"
                    " dead-letters list|redrive); see docs/day-two.md.",
                ),
            ),
        ],
    },
    {
        # Two replicas hold 16 partitions each; one goes at minute 10 and is not replaced.
        "interval": "1m",
        "input_series": [
            {
                "series": f'bucketnotify_lease_partitions_owned{{namespace="{NS}",pod="d-0"}}',
                "values": "16x30",
            },
            {
                "series": f'bucketnotify_lease_partitions_owned{{namespace="{NS}",pod="d-1"}}',
                "values": "16x10 _x20",
            },
        ],
        "alert_rule_test": [
            alert("BucketNotifyPartitionsUnowned", "9m"),
            alert(
                "BucketNotifyPartitionsUnowned",
                "25m",
                fired(
                    {"severity": "critical"},
                    "Delivery replicas hold 16 of 32 partitions",
                    "Shards of unheld partitions are not delivered. Look for delivery pods"
                    " that are not Ready and for Lease errors in their logs.",
                ),
            ),
        ],
    },
    {
        # A leader and a follower, then only the follower (the leader's pod gone), then none.
        "interval": "1m",
        "input_series": [
            {
                "series": f'bucketnotify_operator_leader{{namespace="{NS}",pod="o-0"}}',
                "values": "1x10 _x30",
            },
            {
                "series": f'bucketnotify_operator_leader{{namespace="{NS}",pod="o-1"}}',
                "values": "0x25 _x15",
            },
        ],
        "alert_rule_test": [
            alert("BucketNotifyOperatorNotLeading", "9m"),
            alert("BucketNotifyOperatorNotLeading", "12m"),
            *(
                alert(
                    "BucketNotifyOperatorNotLeading",
                    at,
                    fired(
                        {"severity": "critical"},
                        "No operator replica leads: Topics and BucketNotifications are not"
                        " reconciled",
                        "No replica holds the leader Lease (or none is scraped). Look for"
                        " operator pods that are not Ready, and for Lease errors in their"
                        " logs.",
                    ),
                )
                for at in ("24m", "35m")
            ),
        ],
    },
    {
        # The API server fails open on our webhook at minute 5 (failurePolicy Ignore), and
        # another webhook's failures never count.
        "interval": "1m",
        "input_series": [
            {
                "series": "apiserver_admission_webhook_fail_open_count"
                '{name="validate.bucketnotify.io",type="validating"}',
                "values": "0 0 0 0 0 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2",
            },
            {
                "series": "apiserver_admission_webhook_fail_open_count"
                '{name="validate.example.com",type="validating"}',
                "values": "0+5x22",
            },
        ],
        "alert_rule_test": [
            alert("BucketNotifyWebhookFailing", "4m"),
            alert(
                "BucketNotifyWebhookFailing",
                "10m",
                fired(
                    {"severity": "warning"},
                    "The API server cannot reach the bucketnotify admission webhook",
                    "2 calls failed in 10 minutes: with failurePolicy Ignore the objects"
                    " were admitted unchecked (the operator still refuses bad ones with a"
                    " condition), with Fail they were refused. Check the operator pods and the"
                    " webhook Service. Needs the API server's own metrics scraped.",
                ),
            ),
            alert("BucketNotifyWebhookFailing", "22m"),
        ],
    },
    {
        # Topics that cannot reach their gateway for 20 minutes; a Topic waiting for another
        # (TopicNotReady) is not an error.
        "interval": "1m",
        "input_series": [
            {
                "series": "bucketnotify_reconcile_errors_total"
                '{kind="topic",reason="GatewayUnreachable"}',
                "values": "0+1x40",
            },
            {
                "series": "bucketnotify_reconcile_errors_total"
                '{kind="notification",reason="TopicNotReady"}',
                "values": "0+5x40",
            },
        ],
        "alert_rule_test": [
            alert("BucketNotifyReconcileErrors", "10m"),
            alert(
                "BucketNotifyReconcileErrors",
                "40m",
                fired(
                    {"severity": "warning", "kind": "topic", "reason": "GatewayUnreachable"},
                    "topic handler runs fail: GatewayUnreachable",
                    "Objects are not Ready; kubectl get topics,bucketnotifications -A shows"
                    " which and why.",
                ),
            ),
        ],
    },
]


def test_each_alert_fires_when_it_should_and_stays_quiet_otherwise(
    helm_bin: str, promtool: str, tmp_path: Path
) -> None:
    objs = template(helm_bin, sets=['metrics.prometheusRule={"enabled":true}'])
    (rule,) = [o for o in objs if o["kind"] == "PrometheusRule"]
    alerts = {r["alert"] for group in rule["spec"]["groups"] for r in group["rules"]}
    tested = {t["alertname"] for case in CASES for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert tested == alerts, f"alerts without a firing case: {alerts - tested}"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": CASES})
    )
    result = subprocess.run(
        [promtool, "test", "rules", "tests.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
