"""`python -m demo up` and `down --keep-services`, run as a person runs them (`make demo`
minus the service start-up, which the session fixtures do), against the real services.

The demo checks its own arrivals; this test checks what it left behind independently: the
HTTP receiver's file, the gateway's topics and notification configuration, the Spark job's
summary and page, and that `down` stops every process it started and cleans the gateway.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from demo import samples, uploads
from demo.processes import STATE, STATE_DIR

from tests.kubectl import Kubectl
from tests.localservices import REPO, LocalService
from tests.s3 import s3_client, sns_client

pytestmark = pytest.mark.usefixtures("kube", "rgw", "rabbitmq", "kafka")

NAMESPACE = "bucketnotify-demo"
# The demo waits for Spark, which takes minutes on a loaded two-core machine.
UP_TIMEOUT_S = 1500


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "demo", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=UP_TIMEOUT_S,
        check=False,
    )
    print(result.stdout)
    print(result.stderr, file=sys.stderr)
    return result


def demo_gateway_topics(rgw: LocalService) -> set[str]:
    arns = [t["TopicArn"] for t in sns_client(rgw).list_topics().get("Topics", [])]
    names = {arn.rsplit(":", 1)[1] for arn in arns}
    return {name for name in names if name.startswith(f"{NAMESPACE}_")}


def notification_ids(rgw: LocalService) -> set[str]:
    config = s3_client(rgw).get_bucket_notification_configuration(Bucket=samples.BUCKET)
    return {c["Id"] for c in config.get("TopicConfigurations", [])}


def alive(pid: int) -> bool:
    # The demo's processes are not ours: `up` started them in sessions of their own.
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(2 * UP_TIMEOUT_S + 300)
def test_demo_up_shows_every_endpoint_and_down_cleans_up(
    rgw: LocalService, kubectl: Kubectl
) -> None:
    up = demo("up")
    assert up.returncode == 0, up.stderr[-3000:]
    out = up.stdout
    pids = [p["pid"] for p in json.loads(STATE.read_text())["processes"]]
    try:
        # Each endpoint kind printed its arrivals, and the demo's own check passed.
        expected = uploads.expected_events()
        for kind, events in expected.items():
            for event_name, key in events:
                line = rf"{kind}\s+{re.escape(event_name)}\s+{re.escape(key)}\s+after\s+[\d.]+ s"
                assert re.search(line, out), f"no arrival line for {kind} {event_name} {key}"
            assert f"{kind}: all {sum(events.values())} expected events arrived" in out
        # The HTTP receiver got exactly the matching objects, each once.
        received = [
            json.loads(line)["record"]
            for line in (STATE_DIR / "received.jsonl").read_text().splitlines()
        ]
        got = Counter((r["eventName"], r["s3"]["object"]["key"]) for r in received)
        assert got == expected["http"]
        # Queue stats of the three persistent Topics, with their owners.
        for topic in samples.TOPICS:
            assert f"$ bucketnotify topic stats {topic} -n {NAMESPACE}" in out
        assert out.count("RESERVATIONS") == len(samples.TOPICS)
        assert "bucketnotify_lease_partitions_owned" in out
        # The Spark report: the page exists, and its summary counts this run's events.
        found = re.search(r"report \(HTML\): (\S+\.html)", out)
        assert found, "no report path in the output"
        page = Path(found.group(1))
        assert page.is_file() and "webhook" in page.read_text()
        summary_path = re.search(r"summary: +(\S+\.json)", out)
        assert summary_path
        summary = json.loads(Path(summary_path.group(1)).read_text())
        total = sum(sum(events.values()) for events in expected.values())
        assert summary["totals"]["delivered"] == total
        assert summary["totals"]["triggered"] == total
        assert {t["topic"] for t in summary["topics"]} == set(samples.TOPICS)
        # What down must remove existed.
        assert demo_gateway_topics(rgw) == {f"{NAMESPACE}_{t}" for t in samples.TOPICS}
        assert {"uploads-images", "uploads-reports", "uploads-confidential"} <= (
            notification_ids(rgw)
        )
        assert len(pids) == 4 and all(alive(pid) for pid in pids)
    finally:
        down = demo("down", "--keep-services")
    assert down.returncode == 0, down.stderr[-3000:]
    assert not STATE.exists()
    assert [pid for pid in pids if alive(pid)] == []
    assert demo_gateway_topics(rgw) == set()
    assert not {"uploads-images", "uploads-reports", "uploads-confidential"} & (
        notification_ids(rgw)
    )
    left = kubectl.run("get", "topics,bucketnotifications", "-n", NAMESPACE, "-o", "name")
    assert left.stdout.strip() == ""
