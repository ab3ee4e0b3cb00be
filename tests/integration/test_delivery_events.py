"""Kubernetes Events of the delivery service on Topics, and its JSON logs without secrets.

The delivery service runs as a real process against the real apiserver and RabbitMQ; the
test plays the gateway (it POSTs to the ingest with the Topic's token) and the operator
(it creates the token Secret), because neither is what is tested here.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import itertools
import json
import logging
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bucketnotify.delivery.model.queue import QueueName
from bucketnotify.delivery.recorded.kube_events import COMPONENT
from bucketnotify.delivery.stores.localdir import LocalDirStore
from bucketnotify.kube import event_recorder
from bucketnotify.kube.apiserver import ApiClient
from bucketnotify.kube.event_recorder import EventRecorder, ObjectRef
from devstack.servers.recording import RecordingHttpServer
from tests.delivery import push_records
from tests.kubeapi import api_client
from tests.kubectl import Kubectl
from tests.localservices import LocalService
from tests.processes import Program, free_port
from tests.resources import apply, credentials_secret, object_events, token_secret
from tests.serviceaccounts import proxied_kubeconfig
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")


def topic_events(kubectl: Kubectl, namespace: str, topic: str) -> list[dict[str, Any]]:
    return object_events(kubectl, namespace, "Topic", topic)


def reasons(events: list[dict[str, Any]]) -> list[str]:
    return [e["reason"] for e in events]


def broker_secret(kubectl: Kubectl, namespace: str, rabbitmq: LocalService) -> None:
    """Secret ``mq-creds`` with the local RabbitMQ's user and password."""
    credentials_secret(
        kubectl, namespace, "mq-creds", rabbitmq["AMQP_USER"], rabbitmq["AMQP_PASSWORD"]
    )


@pytest.fixture()
def port() -> int:
    return free_port()


def replica_env(kube: LocalService, namespace: str, port: int, tmp_path: Path) -> dict[str, str]:
    return {
        "KUBECONFIG": kube["KUBECONFIG_ADMIN"],
        "BUCKETNOTIFY_DELIVERY_STORE": f"dir://{tmp_path / 'queues'}",
        "BUCKETNOTIFY_DELIVERY_LISTEN_PORT": str(port),
        "BUCKETNOTIFY_DELIVERY_LEASE_NAMESPACE": namespace,
        "BUCKETNOTIFY_DELIVERY_NAMESPACES": json.dumps([namespace]),
        "BUCKETNOTIFY_DELIVERY_IDENTITY": "replica-ev",
        "BUCKETNOTIFY_DELIVERY_REFRESH_INTERVAL_SECONDS": "1",
        "BUCKETNOTIFY_LOG_FORMAT": "json",
        "BUCKETNOTIFY_LOG_LEVEL": "DEBUG",
    }


@pytest.fixture()
def replica(kube: LocalService, namespace: str, port: int, tmp_path: Path) -> Iterator[Program]:
    """One delivery replica writing JSON logs at DEBUG, the most talkative level; the local
    RabbitMQ has no TLS, so it may send credentials in the clear."""
    program = Program(
        ["delivery"],
        {
            **replica_env(kube, namespace, port, tmp_path),
            "BUCKETNOTIFY_DELIVERY_ALLOW_CLEARTEXT_SECRETS": "true",
        },
    )
    yield program
    program.stop()
    print(f"--- delivery log ---\n{program.log()[-4000:]}")


def readiness(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code
    except OSError:
        return 0


def test_a_replica_stays_ready_and_takes_pushes_through_an_api_server_outage(
    kube: LocalService, kubectl: Kubectl, namespace: str, port: int, tmp_path: Path
) -> None:
    """The replica reaches the API server through a proxy the test cuts for longer than
    the Lease duration: /readyz answers 200 all along and the ingest still commits (it needs
    the store, not the API server), though the replica cannot renew its Leases meanwhile."""
    proxy = proxied_kubeconfig(kube, tmp_path / "kubeconfig")
    env = {
        **replica_env(kube, namespace, port, tmp_path),
        "KUBECONFIG": str(tmp_path / "kubeconfig"),
        "BUCKETNOTIFY_DELIVERY_LEASE_DURATION_SECONDS": "4",
        "BUCKETNOTIFY_DELIVERY_RENEW_DEADLINE_SECONDS": "3",
        "BUCKETNOTIFY_DELIVERY_RENEW_INTERVAL_SECONDS": "1",
    }
    proxy.start()
    program = Program(["delivery"], env)
    try:
        apply(
            kubectl, namespace, "Topic", "hook",
            {"endpoint": {"http": {"url": "http://127.0.0.1:9/"}}, "persistent": True},
        )  # fmt: skip
        token = token_secret(kubectl, namespace, "hook")
        wait_until(
            lambda: push_records(port, namespace, "hook", token, ["before"]),
            lambda status: status == 200,
            30,
            "the ingest to accept events for Topic hook",
        )
        # The ingest looks a Topic up itself before the replica's first read of the Topics,
        # which comes after its first Lease round (32 Leases to write): it is ready only then.
        wait_until(lambda: readiness(port), lambda status: status == 200, 30, "a ready replica")

        proxy.stop()
        outage_ends = time.monotonic() + 4 + 3  # past the Lease duration and the deadline
        answers = []
        while time.monotonic() < outage_ends:
            answers.append(readiness(port))
            time.sleep(0.25)
        assert set(answers) == {200}, answers
        assert push_records(port, namespace, "hook", token, ["during"]) == 200
        # Its Lease rounds begin with the member Lease, so the outage fails the whole round.
        assert "lease round failed" in program.log(), "the outage was not seen"
        store = LocalDirStore(tmp_path / "queues")
        stats = asyncio.run(store.stats(QueueName(namespace, "hook"), time.time()))
        assert stats.entries == 2, "both pushes wait in the queue (the endpoint refuses)"
    finally:
        proxy.stop()
        program.stop()
        print(f"--- delivery log ---\n{program.log()[-4000:]}")


def test_broker_credentials_without_tls_are_refused_and_the_events_wait(
    kube: LocalService,
    kubectl: Kubectl,
    namespace: str,
    rabbitmq: LocalService,
    port: int,
    tmp_path: Path,
) -> None:
    """A Topic the operator would refuse (credentials over plain AMQP) may still reach the
    replica, e.g. edited after it was accepted: the replica does not connect with the
    password, says why on the Topic, and keeps the events queued."""
    password = rabbitmq["AMQP_PASSWORD"]
    program = Program(["delivery"], replica_env(kube, namespace, port, tmp_path))
    try:
        broker_secret(kubectl, namespace, rabbitmq)
        apply(
            kubectl,
            namespace,
            "Topic",
            "plain",
            {
                "endpoint": {
                    "amqp": {
                        "url": f"amqp://{rabbitmq['AMQP_HOST']}:{rabbitmq['AMQP_PORT']}",
                        "exchange": "amq.topic",
                        "credentialsRef": {"secretName": "mq-creds"},
                    }
                },
                "persistent": True,
                "delivery": {"shards": 1},
            },
        )
        token = token_secret(kubectl, namespace, "plain")
        wait_until(
            lambda: push_records(port, namespace, "plain", token, ["a", "b"]),
            lambda status: status == 200,
            30,
            "the ingest to accept events for Topic plain",
        )
        refused = wait_until(
            lambda: topic_events(kubectl, namespace, "plain"),
            lambda ev: "CleartextCredentials" in reasons(ev),
            30,
            "CleartextCredentials on Topic plain",
        )
        event = {e["reason"]: e for e in refused}["CleartextCredentials"]
        assert event["type"] == "Warning"
        assert "without TLS" in event["message"] and "amqps://" in event["message"]
        assert "EndpointReady" not in reasons(refused)
        store = LocalDirStore(tmp_path / "queues")
        stats = asyncio.run(store.stats(QueueName(namespace, "plain"), time.time()))
        assert stats.entries == 2, "the accepted events wait in the queue"
    finally:
        program.stop()
    assert password not in program.log()
    assert "CleartextCredentials" in program.log() or "without TLS" in program.log()


def test_failure_recovery_loss_full_queue_and_missing_secret_are_topic_events_without_secrets(
    kubectl: Kubectl,
    namespace: str,
    rabbitmq: LocalService,
    replica: Program,
    port: int,
    tmp_path: Path,
) -> None:
    """Each transition is one Event on its Topic (a failing endpoint is one aggregated
    Event, not one per round); neither Events nor the JSON log show a token or password."""
    password = rabbitmq["AMQP_PASSWORD"]
    tokens: list[str] = []
    with RecordingHttpServer(status=500) as receiver:
        # An endpoint that fails, then recovers; events beyond maxRetries are lost.
        apply(
            kubectl,
            namespace,
            "Topic",
            "hook",
            {
                "endpoint": {"http": {"url": f"{receiver.url}/hook"}},
                "persistent": True,
                "maxRetries": 1,
                "delivery": {"shards": 2},
            },
        )
        tokens.append(token_secret(kubectl, namespace, "hook"))
        # A queue of one entry whose endpoint fails: the second request finds it full.
        apply(
            kubectl,
            namespace,
            "Topic",
            "tiny",
            {
                "endpoint": {"http": {"url": f"{receiver.url}/tiny"}},
                "persistent": True,
                "delivery": {"shards": 1, "maxQueueEntries": 1},
            },
        )
        tokens.append(token_secret(kubectl, namespace, "tiny"))
        # maxQueueBytes from the spec (its minimum, 1 KiB).
        apply(
            kubectl,
            namespace,
            "Topic",
            "narrow",
            {
                "endpoint": {"http": {"url": f"{receiver.url}/narrow"}},
                "persistent": True,
                "delivery": {"shards": 1, "maxQueueBytes": 1024},
            },
        )
        tokens.append(token_secret(kubectl, namespace, "narrow"))
        # A broker whose credentials Secret does not exist yet.
        apply(
            kubectl,
            namespace,
            "Topic",
            "mq",
            {
                "endpoint": {
                    "amqp": {
                        "url": f"amqp://{rabbitmq['AMQP_HOST']}:{rabbitmq['AMQP_PORT']}",
                        "exchange": "amq.topic",
                        "credentialsRef": {"secretName": "mq-creds"},
                    }
                },
                "persistent": True,
                "delivery": {"shards": 1},
            },
        )
        tokens.append(token_secret(kubectl, namespace, "mq"))

        wait_until(
            lambda: push_records(port, namespace, "hook", tokens[0], ["a", "b", "c"]),
            lambda status: status == 200,
            30,
            "the ingest to accept events for Topic hook",
        )
        failing = wait_until(
            lambda: topic_events(kubectl, namespace, "hook"),
            lambda ev: {"EndpointFailing", "EventsLost"} <= set(reasons(ev)),
            60,
            "EndpointFailing and EventsLost on Topic hook",
        )
        assert push_records(port, namespace, "tiny", tokens[1], ["x"]) == 200
        assert push_records(port, namespace, "tiny", tokens[1], ["y"]) == 503
        # Records of ~400 bytes (key and sequencer are the key): two fit in 1 KiB, three not.
        kept = [f"n{i}" + "x" * 148 for i in range(2)]
        assert push_records(port, namespace, "narrow", tokens[2], kept) == 200
        assert push_records(port, namespace, "narrow", tokens[2], ["m0" + "x" * 148]) == 503
        # Refused whole: what was queued stays, nothing of the refused request is queued.
        store = LocalDirStore(tmp_path / "queues")
        narrow = asyncio.run(store.list(QueueName(namespace, "narrow"), 0))
        assert sorted(json.loads(e.body)["s3"]["object"]["key"] for e in narrow) == kept
        # spec.delivery.shards made each queue: hook of two shards, narrow of one.
        for topic, shards in (("hook", [0, 1]), ("narrow", [0])):
            stats = asyncio.run(store.stats(QueueName(namespace, topic), time.time()))
            assert sorted(stats.shards) == shards, topic
        missing = wait_until(
            lambda: topic_events(kubectl, namespace, "mq"),
            lambda ev: "SecretNotFound" in reasons(ev),
            30,
            "SecretNotFound on Topic mq",
        )
        # More failing rounds of hook: they raise the count of the one Event, if anything.
        time.sleep(3)
        receiver.status = 200
        assert push_records(port, namespace, "hook", tokens[0], ["d"]) == 200
        recovered = wait_until(
            lambda: topic_events(kubectl, namespace, "hook"),
            lambda ev: "EndpointRecovered" in reasons(ev),
            60,
            "EndpointRecovered on Topic hook",
        )
    broker_secret(kubectl, namespace, rabbitmq)
    assert push_records(port, namespace, "mq", tokens[3], ["m"]) == 200
    configured = wait_until(
        lambda: topic_events(kubectl, namespace, "mq"),
        lambda ev: "EndpointReady" in reasons(ev),
        60,  # the Secret is read again within SECRET_REFRESH_SECONDS (30)
        "EndpointReady on Topic mq",
    )
    full = wait_until(
        lambda: topic_events(kubectl, namespace, "tiny"),
        lambda ev: "QueueFull" in reasons(ev),
        30,
        "QueueFull on Topic tiny",
    )

    hook_uid = kubectl.get("topic", "hook", namespace)["metadata"]["uid"]
    by_reason = {e["reason"]: e for e in recovered}
    assert reasons(recovered).count("EndpointFailing") == 1, "one Event per failing series"
    failing_event = by_reason["EndpointFailing"]
    assert failing_event["type"] == "Warning"
    assert failing_event["involvedObject"]["uid"] == hook_uid
    assert failing_event["source"]["component"] == COMPONENT
    assert "500" in failing_event["message"] and "failed pushes since" in failing_event["message"]
    assert by_reason["EventsLost"]["type"] == "Warning"
    assert "deadLetterTopic" in by_reason["EventsLost"]["message"]
    assert by_reason["EndpointRecovered"]["type"] == "Normal"
    assert "failed pushes" in by_reason["EndpointRecovered"]["message"]
    assert {e["reason"]: e for e in full}["QueueFull"]["type"] == "Warning"
    assert "maxQueueEntries" in {e["reason"]: e for e in full}["QueueFull"]["message"]
    assert "mq-creds" in {e["reason"]: e for e in missing}["SecretNotFound"]["message"]
    assert {e["reason"]: e for e in configured}["EndpointReady"]["type"] == "Normal"
    assert failing, "seen before recovery too"

    every_event = json.dumps(
        [topic_events(kubectl, namespace, t) for t in ("hook", "tiny", "narrow", "mq")]
    )
    for secret in (password, *tokens):
        assert secret not in every_event

    replica.stop()
    logged = replica.log()
    for secret in (password, *tokens):
        assert secret not in logged
        assert base64.b64encode(secret.encode()).decode() not in logged  # a Secret's data
    records = [json.loads(line) for line in logged.splitlines() if line.strip()]
    assert all({"timestamp", "severity", "logger", "message"} <= set(r) for r in records)
    assert any(
        r["logger"] == "bucketnotify.delivery.topics.table" and "serving topic" in r["message"]
        for r in records
    )
    assert any(r["severity"] == "debug" for r in records), "DEBUG records were written"
    # Each event past maxRetries is one WARNING naming its bucket and key; nothing else of
    # the hook Topic was lost ("d" came after the recovery).
    lost = [
        r["message"]
        for r in records
        if r["severity"] == "warning" and "event lost" in r["message"] and "/hook " in r["message"]
    ]
    assert all("bucket 'b' key " in m for m in lost), lost  # tests.records.event's bucket
    assert sorted(m.split(" key ")[1].split(" ")[0] for m in lost) == ["'a'", "'b'", "'c'"], lost


@pytest.fixture()
async def api(kube: LocalService) -> AsyncIterator[ApiClient]:
    async with api_client(kube["KUBECONFIG_ADMIN"]) as api:
        yield api


async def test_a_series_of_occurrences_is_one_event_whose_count_rises(
    api: ApiClient, kubectl: Kubectl, namespace: str
) -> None:
    """200 occurrences become one Event with count 200, written at most once per update
    interval, not 200 Events; a message with a credential in a URL is redacted."""
    apply(kubectl, namespace, "Topic", "t", {"endpoint": {"http": {"url": "http://127.0.0.1:9/"}}})
    recorder = EventRecorder(
        api, component=COMPONENT, instance="test", update_interval_s=0.5, flush_interval_s=0.1
    )
    for i in range(200):
        recorder.record(
            ObjectRef("Topic", namespace, "t"),
            "Warning",
            "EndpointFailing",
            "push to amqp://u:hunter2-secret@h failed",
            amount=2,
            unit="failed pushes",
        )
        if i % 50 == 0:
            await asyncio.sleep(0.3)
    await recorder.aclose()
    (event,) = await asyncio.to_thread(topic_events, kubectl, namespace, "t")
    assert event["count"] == 200
    assert event["reason"] == "EndpointFailing" and event["type"] == "Warning"
    assert "hunter2-secret" not in event["message"]
    assert "amqp://***@h" in event["message"] and "(400 failed pushes since" in event["message"]
    assert event["involvedObject"]["uid"] == kubectl.get("topic", "t", namespace)["metadata"]["uid"]


class Clock:
    """The clock of ``bucketnotify.kube.event_recorder`` moved on by the test: its 30 s and 10 min
    pass at once, while the asyncio loop keeps real time."""

    def __init__(self) -> None:
        self.offset = 0.0

    def time(self) -> float:
        return time.time() + self.offset

    def monotonic(self) -> float:
        return time.monotonic() + self.offset


async def series_of(
    kubectl: Kubectl, namespace: str, want: Callable[[list[int]], bool], what: str
) -> list[int]:
    """The counts of Topic t's ``EndpointFailing`` Events, oldest first, once ``want``."""
    deadline = time.monotonic() + 15
    while True:
        found = await asyncio.to_thread(topic_events, kubectl, namespace, "t")
        counts = [
            e["count"]
            for e in sorted(found, key=lambda e: e["firstTimestamp"])
            if e["reason"] == "EndpointFailing"
        ]
        if want(counts):
            return counts
        assert time.monotonic() < deadline, f"{what}: Events counted {counts}"
        await asyncio.sleep(0.1)


async def test_an_event_is_patched_at_most_every_30_s_and_a_series_ends_after_10_quiet_minutes(
    api: ApiClient,
    kubectl: Kubectl,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With the recorder's defaults: the first occurrence is written at once; more within
    30 s are not written (the recorder looks 20 times a second), after 30 s they are; after
    ten quiet minutes the next occurrence is a new Event. Posting is the background's: a post
    the API server refuses is logged, after ``record`` has returned."""
    clock = Clock()
    monkeypatch.setattr(event_recorder, "time", clock)
    apply(kubectl, namespace, "Topic", "t", {"endpoint": {"http": {"url": "http://127.0.0.1:9/"}}})
    recorder = EventRecorder(api, component=COMPONENT, instance="test", flush_interval_s=0.05)
    topic = ObjectRef("Topic", namespace, "t")

    def fail() -> None:
        recorder.record(topic, "Warning", "EndpointFailing", "answered 500")

    try:
        fail()
        await series_of(kubectl, namespace, lambda c: c == [1], "the first written at once")
        fail()
        fail()
        await asyncio.sleep(1)
        assert await series_of(kubectl, namespace, bool, "") == [1], "patched within 30 s"
        clock.offset += 31
        await series_of(kubectl, namespace, lambda c: c == [3], "patched once 30 s passed")

        clock.offset += 601
        await asyncio.sleep(0.5)  # the recorder forgets the quiet series meanwhile
        fail()
        await series_of(kubectl, namespace, lambda c: c == [3, 1], "a new Event after 10 min")

        nowhere = ObjectRef("Topic", f"{namespace}-gone", "t", uid=str(uuid.uuid4()))
        with caplog.at_level(logging.WARNING, logger="bucketnotify.kube.event_recorder"):
            recorder.record(nowhere, "Warning", "EndpointFailing", "answered 500")
            assert "could not post Event" not in caplog.text, "record() waited for the post"
            deadline = time.monotonic() + 15
            while "could not post Event EndpointFailing on Topic" not in caplog.text:
                assert time.monotonic() < deadline, "the refused post was not logged"
                await asyncio.sleep(0.1)
    finally:
        await recorder.aclose()


def test_an_endpoint_that_cannot_be_opened_as_specified_is_endpoint_invalid_until_fixed(
    kube: LocalService,
    kubectl: Kubectl,
    namespace: str,
    kafka: LocalService,
    port: int,
    tmp_path: Path,
) -> None:
    """SASL GSSAPI (Kerberos) cannot be done with a password from a Secret: EndpointInvalid
    (Warning) saying so, the events wait in the queue; the Topic fixed to SCRAM with the
    broker's own user: EndpointReady, and the waiting events are delivered. (The local
    broker's SASL listener has no TLS, so the replica may send the password in the clear.)"""
    program = Program(
        ["delivery"],
        {
            **replica_env(kube, namespace, port, tmp_path),
            "BUCKETNOTIFY_DELIVERY_ALLOW_CLEARTEXT_SECRETS": "true",
        },
    )
    try:
        credentials_secret(
            kubectl,
            namespace,
            "kafka-creds",
            kafka["KAFKA_SCRAM_USER"],
            kafka["KAFKA_SCRAM_PASSWORD"],
        )
        endpoint_topic = f"invalid-{uuid.uuid4().hex[:8]}"

        def spec(mechanism: str) -> dict[str, Any]:
            return {
                "endpoint": {
                    "kafka": {
                        "url": f"kafka://{kafka['KAFKA_SASL_BOOTSTRAP']}",
                        "sasl": {
                            "mechanism": mechanism,
                            "credentialsRef": {"secretName": "kafka-creds"},
                        },
                    }
                },
                "endpointTopic": endpoint_topic,
                "persistent": True,
                "delivery": {"shards": 1},
            }

        apply(kubectl, namespace, "Topic", "kerberos", spec("GSSAPI"))
        token = token_secret(kubectl, namespace, "kerberos")
        wait_until(
            lambda: push_records(port, namespace, "kerberos", token, ["a", "b"]),
            lambda status: status == 200,
            30,
            "the ingest to accept events for Topic kerberos",
        )
        invalid = wait_until(
            lambda: topic_events(kubectl, namespace, "kerberos"),
            lambda ev: "EndpointInvalid" in reasons(ev),
            30,
            "EndpointInvalid on Topic kerberos",
        )
        event = {e["reason"]: e for e in invalid}["EndpointInvalid"]
        assert event["type"] == "Warning"
        assert "GSSAPI" in event["message"] and "Kerberos" in event["message"]
        store = LocalDirStore(tmp_path / "queues")
        stats = asyncio.run(store.stats(QueueName(namespace, "kerberos"), time.time()))
        assert stats.entries == 2, "the accepted events wait in the queue"

        apply(kubectl, namespace, "Topic", "kerberos", spec("SCRAM-SHA-512"))
        wait_until(
            lambda: topic_events(kubectl, namespace, "kerberos"),
            lambda ev: "EndpointReady" in reasons(ev),
            60,
            "EndpointReady on Topic kerberos",
        )
        wait_until(
            lambda: asyncio.run(store.stats(QueueName(namespace, "kerberos"), time.time())).entries,
            lambda n: n == 0,
            60,
            "the waiting events delivered",
        )
    finally:
        program.stop()
    assert kafka["KAFKA_SCRAM_PASSWORD"] not in program.log()


def test_events_past_max_retries_go_to_the_dead_letter_topic_and_are_delivered_there(
    kubectl: Kubectl, namespace: str, replica: Program, port: int, tmp_path: Path
) -> None:
    """maxRetries 1 on a failing endpoint with delivery.deadLetterTopic: the dropped events
    are queued on the dead-letter Topic and delivered by it, one EventsDeadLettered
    (Warning) on the failing Topic and no EventsLost. The delivery records (written beside
    the queues at the stop) have each event ingested once, on its own Topic: none on the
    dead-letter Topic, which records them delivered."""
    with (
        RecordingHttpServer(status=500) as failing,
        RecordingHttpServer() as dead_letters,
    ):
        apply(
            kubectl,
            namespace,
            "Topic",
            "dead",
            {
                "endpoint": {"http": {"url": f"{dead_letters.url}/dead"}},
                "persistent": True,
                "delivery": {"shards": 1},
            },
        )
        token_secret(kubectl, namespace, "dead")
        apply(
            kubectl,
            namespace,
            "Topic",
            "hook",
            {
                "endpoint": {"http": {"url": f"{failing.url}/hook"}},
                "persistent": True,
                "maxRetries": 1,
                "retrySleepDuration": 1,
                "delivery": {"shards": 1, "deadLetterTopic": "dead"},
            },
        )
        token = token_secret(kubectl, namespace, "hook")
        wait_until(
            lambda: push_records(port, namespace, "hook", token, ["x", "y"]),
            lambda status: status == 200,
            30,
            "the ingest to accept events for Topic hook",
        )
        arrived: list[str] = []
        wait_until(
            lambda: (
                arrived.extend(
                    record["s3"]["object"]["key"]
                    for request in dead_letters.received()
                    for record in json.loads(request.body)["Records"]
                )
                or sorted(arrived)
            ),
            lambda keys: keys == ["x", "y"],
            60,
            "both events at the dead-letter Topic's endpoint",
        )
        assert failing.received(), "the events were tried on their own endpoint first"
        events = wait_until(
            lambda: topic_events(kubectl, namespace, "hook"),
            lambda ev: "EventsDeadLettered" in reasons(ev),
            30,
            "EventsDeadLettered on Topic hook",
        )
    by_reason = {e["reason"]: e for e in events}
    assert by_reason["EventsDeadLettered"]["type"] == "Warning"
    assert "EventsLost" not in by_reason

    replica.stop()  # writes the buffered records
    outcomes: dict[str, list[str]] = {"hook": [], "dead": []}
    for path in sorted((tmp_path / "records" / "v1").rglob("*.jsonl.gz")):
        for line in gzip.decompress(path.read_bytes()).decode().splitlines():
            record = json.loads(line)
            outcomes[record["topic"]].append(record["outcome"])
    assert sorted(outcomes["hook"]).count("ingested") == 2, outcomes
    assert outcomes["hook"].count("dead_lettered") == 2, outcomes
    assert sorted(outcomes["dead"]) == ["delivered", "delivered"], outcomes


def test_exponential_backoff_spaces_an_events_attempts_out_to_the_cap(
    kubectl: Kubectl, namespace: str, replica: Program, port: int, tmp_path: Path
) -> None:
    """``retryBackoff: exponential`` on an endpoint that refuses every push: the pauses
    between one event's attempts double from retrySleepDuration (1 s) towards
    maxRetrySleepDuration (8 s), each at least half its step (the jitter's floor; a fixed
    1 s pause never reaches the later floors), and after the fifth attempt the event waits
    at most the cap: its entry's next attempt time, read from the queue store, is at most
    8 s after its last attempt (8 to 16 s uncapped). A replica late to poll only lengthens the
    pauses, so no bound here depends on the machine's speed."""
    with RecordingHttpServer(status=503) as refusing:
        apply(
            kubectl,
            namespace,
            "Topic",
            "flaky",
            {
                "endpoint": {"http": {"url": f"{refusing.url}/flaky"}},
                "persistent": True,
                "retrySleepDuration": 1,
                "delivery": {
                    "shards": 1,
                    "retryBackoff": "exponential",
                    "maxRetrySleepDuration": 8,
                },
            },
        )
        token = token_secret(kubectl, namespace, "flaky")
        wait_until(
            lambda: push_records(port, namespace, "flaky", token, ["k"]),
            lambda status: status == 200,
            30,
            "the ingest to accept the event for Topic flaky",
        )
        times: list[float] = []
        wait_until(
            lambda: times.extend(r.time for r in refusing.received()) or len(times),
            lambda count: count >= 6,
            120,
            "six attempts of the event",
        )
        (entry,) = asyncio.run(
            LocalDirStore(tmp_path / "queues").list(QueueName(namespace, "flaky"), 0)
        )
        times.extend(r.time for r in refusing.received())  # any attempt made meanwhile
    times.sort()
    pauses = [later - earlier for earlier, later in itertools.pairwise(times)][:5]
    steps = [1, 2, 4, 8, 8]
    print(f"pauses between attempts: {[round(p, 2) for p in pauses]} (steps {steps})")
    for pause, step in zip(pauses, steps, strict=True):
        assert pause >= step / 2 - 0.05, (pauses, steps)
    # The entry as its last attempt left it: attempts made, and when the next is due.
    assert entry.attempts >= 6 and len(times) >= entry.attempts, (entry.attempts, len(times))
    # Due at most the cap after the attempt was answered (the round's clock starts before
    # its push, so this wait is a little shorter than the pause it drew, never longer);
    # without the cap, a fifth retry's pause is 8 to 16 s.
    waits = entry.not_before - times[entry.attempts - 1]
    assert waits <= 8 + 0.1, (entry.attempts, waits)
