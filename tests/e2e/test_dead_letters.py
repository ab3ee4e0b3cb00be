"""Dead letters a Topic keeps: listed with why they were dropped, redriven once the endpoint
is back (each event arrives, with its identity and eventTime), a redrive killed halfway and
run again, purged, and bounded.

Real everything: the operator and a delivery replica as subprocesses, the apiserver, Ceph
RGW handing events to the ingest (hand-off sync), the local-directory queue store, an HTTP
endpoint that answers 503 and then 200, and the admin CLI as users run it.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import shlex
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from bucketnotify.delivery.model.dead_letters import dead_letter_queue
from bucketnotify.delivery.model.queue import QueueName
from devstack.servers.recording import RecordingHttpServer
from tests.delivery import scrape
from tests.kubectl import Kubectl
from tests.localservices import REPO, LocalService
from tests.operator import StartOperator
from tests.processes import BIN, Program, base_env, run_cli
from tests.resources import apply, condition
from tests.s3 import s3_client
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")

PASSWORD = "hunter2-dead-letters"
TIME_TO_LIVE_S = 4
DAY_TWO = REPO / "docs" / "day-two.md"


def documented(namespace: str) -> dict[str, list[str]]:
    """The commands of docs/day-two.md's redrive example, by verb, in ``namespace``."""
    section = DAY_TWO.read_text().split("## Redrive after an endpoint outage", 1)[1]
    block = re.search(r"```console\n(.*?)```", section, re.DOTALL)
    assert block, "docs/day-two.md's redrive section has no console block"
    commands = {}
    for line in block[1].splitlines():
        words = shlex.split(line.removeprefix("$ "))
        assert words[:2] == ["bucketnotify", "dead-letters"], line
        at = words.index("-n")
        words[at + 1] = namespace
        commands[words[2]] = words[2:]
    assert set(commands) == {"list", "redrive", "purge"}, commands
    return commands


@pytest.fixture()
def replica_settings() -> dict[str, str]:
    # The survey counts the dead letters and picks up redriven events: every second.
    return {"STATS_INTERVAL_SECONDS": "1"}


@pytest.fixture()
def env(kube: LocalService, queues: Path, namespace: str) -> dict[str, str]:
    """The admin CLI's settings: the delivery service's store and Leases."""
    return {
        "KUBECONFIG": kube["KUBECONFIG_ADMIN"],
        "BUCKETNOTIFY_DELIVERY_STORE": f"dir://{queues}",
        "BUCKETNOTIFY_DELIVERY_LEASE_NAMESPACE": namespace,
    }


def cli(env: dict[str, str], *args: str) -> Any:
    return asyncio.run(run_cli(env, *args))


def kept(env: dict[str, str], namespace: str, topic: str) -> list[dict[str, Any]]:
    result = cli(env, "dead-letters", "list", topic, "-n", namespace, "-o", "json")
    assert result.code == 0, result.err
    found: list[dict[str, Any]] = result.json()
    return found


def counter(port: int, name: str, namespace: str, topic: str) -> float:
    samples = scrape(f"http://127.0.0.1:{port}/metrics")
    return samples.get((name, frozenset({"namespace": namespace, "topic": topic}.items())), 0.0)


def topic_with_kept_dead_letters(
    kubectl: Kubectl,
    namespace: str,
    s3: Any,
    name: str,
    url: str,
    **dead_letters: Any,
) -> str:
    """A persistent Topic keeping its dead letters, a bucket notifying it of PUTs; its
    bucket."""
    apply(
        kubectl,
        namespace,
        "Topic",
        name,
        {
            "endpoint": {"http": {"url": url}},
            "persistent": True,
            "timeToLive": TIME_TO_LIVE_S,
            "retrySleepDuration": 1,
            "delivery": {
                "handoff": "sync",
                "shards": 3,
                "deadLetters": {"keep": True, **dead_letters},
            },
        },
    )
    condition(kubectl, namespace, "topic", name)
    bucket = f"dl-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    apply(
        kubectl,
        namespace,
        "BucketNotification",
        f"{name}-n",
        {"bucket": bucket, "topicRef": {"name": name}, "testEvent": False},
    )
    condition(kubectl, namespace, "bucketnotification", f"{name}-n")
    return bucket


def redrive_process(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(BIN / "bucketnotify"), "dead-letters", "redrive", *args],
        env={**base_env(), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_dead_letters_are_listed_redriven_after_a_kill_halfway_and_purged(
    kubectl: Kubectl,
    env: dict[str, str],
    namespace: str,
    queues: Path,
    start_operator: StartOperator,
    replica: tuple[Program, int],
    rgw: LocalService,
) -> None:
    program, port = replica
    start_operator(ingest_url=f"http://127.0.0.1:{port}")
    s3 = s3_client(rgw)
    keys = [f"outage/{n}" for n in range(6)]
    with RecordingHttpServer(keep_alive=False) as endpoint:
        endpoint.status = 503
        bucket = topic_with_kept_dead_letters(
            kubectl,
            namespace,
            s3,
            "orders",
            f"{endpoint.url}/hook?access_token={PASSWORD}",
        )
        for key in keys:
            s3.put_object(Bucket=bucket, Key=key, Body=b"x")
        s3.put_object(Bucket=bucket, Key="other/1", Body=b"x")

        # Each is tried, fails, expires after its timeToLive and is kept.
        letters = wait_until(
            lambda: kept(env, namespace, "orders"),
            lambda found: len(found) == len(keys) + 1,
            TIME_TO_LIVE_S + 30,
            "7 dead letters kept",
        )
        for letter in letters:
            assert letter["outcome"] == "expired", letter
            assert letter["reason"] == f"timeToLive of {TIME_TO_LIVE_S} s passed", letter
            assert letter["attempts"] >= 1, letter
            assert "503" in (letter["lastError"] or ""), letter
            assert letter["firstFailureTime"] <= letter["lastFailureTime"], letter
            assert letter["lastFailureTime"] <= letter["droppedTime"], letter
        before = {
            letter["event"]["s3"]["object"]["key"]: (letter["eventId"], letter["event"])
            for letter in letters
        }
        assert sorted(before) == sorted([*keys, "other/1"])
        doc = documented(namespace)
        table = cli(env, "dead-letters", *doc["list"])
        assert table.code == 0, table.err
        assert "timeToLive of 4 s passed" in table.out and "outage/3" in table.out, table.out
        shown = cli(env, "dead-letters", "show", "orders", letters[0]["id"], "-n", namespace)
        assert shown.code == 0 and letters[0]["eventId"] in shown.out, shown.err
        # The operator puts the count in the Topic's status (from the replica's report).
        wait_until(
            lambda: kubectl.get("topic", "orders", namespace).get("status", {}),
            lambda st: st.get("delivery", {}).get("deadLetters") == len(keys) + 1,
            30,
            "status.delivery.deadLetters 7",
        )
        assert counter(port, "bucketnotify_dead_letters", namespace, "orders") == len(keys) + 1
        size = counter(port, "bucketnotify_dead_letters_size", namespace, "orders")
        # Each keeps its event and more (why it was dropped).
        compact = sum(len(json.dumps(r["event"], separators=(",", ":"))) for r in letters)
        assert size > compact, (size, compact)
        delivered_before = len([r for r in endpoint.received() if r.status == 200])
        assert delivered_before == 0

        endpoint.status = 200
        # A redrive of the outage's events, one a second, killed halfway: frozen first, so
        # what it had moved is read while it stands still, then killed. Then the
        # documented one, to its end.
        first = redrive_process(
            env, "orders", "-n", namespace, "--prefix", "outage/", "--rate", "1"
        )
        try:
            wait_until(
                lambda: len(kept(env, namespace, "orders")),
                lambda left: left <= len(keys) + 1 - 2,
                60,
                "two of the dead letters moved",
            )
            first.send_signal(signal.SIGSTOP)
            left_at_kill = len(kept(env, namespace, "orders"))
            first.send_signal(signal.SIGKILL)
        finally:
            first.kill()
            first.wait()
        assert first.returncode == -signal.SIGKILL
        assert 1 < left_at_kill < len(keys) + 1, f"killed with {left_at_kill} left: not halfway"

        again = cli(env, "dead-letters", *doc["redrive"])
        assert again.code == 0, again.err
        assert again.out.startswith("redrove "), again.out
        remaining = kept(env, namespace, "orders")
        assert [r["event"]["s3"]["object"]["key"] for r in remaining] == ["other/1"]

        records: list[dict[str, Any]] = []

        def arrived() -> collections.Counter[str]:
            # received() hands each request over once: keep them.
            records.extend(
                json.loads(r.body)["Records"][0] for r in endpoint.received() if r.status == 200
            )
            return collections.Counter(r["s3"]["object"]["key"] for r in records)

        wait_until(arrived, lambda got: set(got) == set(keys), 30, "every redriven event")
        time.sleep(3)  # a second copy, if there were one, would come now
        got = arrived()
        twice = sum(n - 1 for n in got.values())
        assert set(got) == set(keys) and twice <= 1, got
        for record in records:
            key = record["s3"]["object"]["key"]
            # The event as it was dropped: its eventTime and every other field.
            assert record == before[key][1], key
        redriven = counter(port, "bucketnotify_dead_letters_redriven_total", namespace, "orders")
        # A kill between a removal and its tally undercounts that one event.
        wait_until(
            lambda: counter(port, "bucketnotify_dead_letters_redriven_total", namespace, "orders"),
            lambda n: len(keys) - 1 <= n <= len(keys),
            10,
            f"the redriven counter at {len(keys) - 1} or {len(keys)} (was {redriven})",
        )

        refused = cli(env, "dead-letters", "purge", "orders", "-n", namespace)
        assert refused.code == 1 and "--all" in refused.err, refused
        purged = cli(env, "dead-letters", *doc["purge"])
        assert purged.code == 0 and "purged 1 " in purged.out, purged
        assert kept(env, namespace, "orders") == []
        wait_until(
            lambda: counter(port, "bucketnotify_dead_letters_purged_total", namespace, "orders"),
            lambda n: n == 1,
            10,
            "the purged counter at 1",
        )
        outputs = table.out + shown.out + again.out + again.err + json.dumps(letters)
        assert PASSWORD not in outputs, "a credential in the CLI's output"
        assert PASSWORD not in program.log()


def test_dead_letters_past_their_bounds_are_discarded_and_said(
    kubectl: Kubectl,
    env: dict[str, str],
    namespace: str,
    queues: Path,
    start_operator: StartOperator,
    replica: tuple[Program, int],
    rgw: LocalService,
) -> None:
    program, port = replica
    start_operator(ingest_url=f"http://127.0.0.1:{port}")
    s3 = s3_client(rgw)
    with RecordingHttpServer(keep_alive=False) as endpoint:
        endpoint.status = 503
        bucket = topic_with_kept_dead_letters(
            kubectl, namespace, s3, "small", endpoint.url, maxEntries=2
        )
        for n in range(5):
            s3.put_object(Bucket=bucket, Key=f"k{n}", Body=b"x")
        wait_until(
            lambda: counter(port, "bucketnotify_dead_letters_discarded_total", namespace, "small"),
            lambda n: n == 3,
            TIME_TO_LIVE_S + 30,
            "three dead letters discarded",
        )
        assert len(kept(env, namespace, "small")) == 2
        assert counter(port, "bucketnotify_dead_letters_kept_total", namespace, "small") == 2
        # Lost, and counted so.
        assert counter(port, "pubsub_event_lost_total", namespace, "small") == 3
        status = wait_until(
            lambda: kubectl.get("topic", "small", namespace).get("status", {}),
            lambda st: "deadLettersDiscardedTime" in st.get("delivery", {}),
            30,
            "status.delivery.deadLettersDiscardedTime",
        )
        assert status["delivery"]["deadLetters"] == 2
        said = [
            json.loads(line)
            for line in program.log().splitlines()
            if "dead letters discarded" in line
        ]
        assert [s["severity"] for s in said] == ["warning"], said
    # The dead-letter queue goes with its Topic.
    kubectl.run("delete", "topic", "small", "-n", namespace, "--wait=true")
    queue = dead_letter_queue(QueueName(namespace, "small"))
    wait_until(
        lambda: (queues / queue.namespace / queue.topic).exists(),
        lambda there: not there,
        30,
        "the dead-letter queue deleted with its Topic",
    )
