"""The ingest of a real `bucketnotify delivery` process under malformed and hostile bodies.

Every body here is refused with 4xx and a message, nothing reaches the queue store or the
endpoint, and the process keeps answering (its memory before and after is printed: a figure,
for benchmarks to bound). A valid event sent last is delivered, so the store and the
endpoint were able to take what was refused.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bucketnotify.delivery.model.queue import QueueName
from bucketnotify.delivery.stores.localdir import LocalDirStore
from devstack.servers.recording import RecordingHttpServer
from tests.delivery import StartCluster, scrape
from tests.kubectl import Kubectl
from tests.operator import StartOperator
from tests.records import event
from tests.resources import apply, condition
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("crds")

MAX_BODY = 4 * 1024 * 1024  # ingest.MAX_BODY_BYTES


def body(*records: Any) -> bytes:
    return json.dumps({"Records": list(records)}).encode()


VALID = body(event())
DEEP = 100_000

# (what, body, content type); every one must be refused and enqueue nothing.
HOSTILE: list[tuple[str, bytes, str]] = [
    ("empty", b"", "application/json"),
    ("null", b"null", "application/json"),
    ("a list", b"[]", "application/json"),
    ("no Records", b"{}", "application/json"),
    ("Records null", b'{"Records": null}', "application/json"),
    ("Records an object", b'{"Records": {}}', "application/json"),
    ("a number record", b'{"Records": [1]}', "application/json"),
    ("an empty record", b'{"Records": [{}]}', "application/json"),
    ("key a number", body(event(key=1)), "application/json"),
    ("key null", body(event(key=None)), "application/json"),
    ("bucket an object", body(event(bucket={"name": "b"})), "application/json"),
    (
        "one bad record among good ones",
        body(event(), event(key=[]), event()),
        "application/json",
    ),
    ("not JSON", b"Records=1", "application/x-www-form-urlencoded"),
    ("truncated", VALID[:-3], "application/json"),
    ("not UTF-8", VALID.replace(b'"k"', b'"\xff\xfe\xfa"'), "application/json"),
    ("UTF-16", json.dumps({"Records": [event()]}).encode("utf-16"), "application/json"),
    ("UTF-8 BOM", b"\xef\xbb\xbf" + VALID, "application/json"),
    ("lone surrogate key", VALID.replace(b'"k"', b'"\\ud800"'), "application/json"),
    ("NaN", body(event()).replace(b'"eventName"', b'"n": NaN, "eventName"'), "application/json"),
    ("Infinity", VALID.replace(b'"eventName"', b'"n": -Infinity, "eventName"'), "application/json"),
    (
        "huge integer",
        VALID.replace(b'"eventName"', b'"n": ' + b"9" * 5000 + b', "eventName"'),
        "application/json",
    ),
    ("deeply nested", b"[" * DEEP + b"]" * DEEP, "application/json"),
    (
        "deeply nested inside a record",
        VALID.replace(b'"eventName"', b'"x": ' + b"[" * DEEP + b"]" * DEEP + b', "eventName"'),
        "application/json",
    ),
    (
        "multipart",
        b"--x\r\nContent-Disposition: form-data\r\n\r\n" + VALID,
        "multipart/form-data; boundary=x",
    ),
    ("just over the limit", b'{"Records": [' + b" " * MAX_BODY + b"]}", "application/json"),
    ("text/plain garbage", b"\x00" * 1000, "text/plain"),
]


def post(
    port: int, path: str, data: bytes, content_type: str, chunked: bool = False
) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        headers = {"Content-Type": content_type}
        if chunked:
            connection.request(
                "POST", path, body=iter([data]), headers=headers, encode_chunked=True
            )
        else:
            connection.request("POST", path, body=data, headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.read().decode(errors="replace")
    finally:
        connection.close()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


# Bodies a fuzzer makes: arbitrary bytes, arbitrary JSON, and gateway-shaped JSON with
# one field of the wrong type somewhere.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
wrong_types = st.none() | st.booleans() | st.integers() | st.lists(st.text(), max_size=2)
fuzzed_bodies = st.one_of(
    st.binary(max_size=2048),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.text(max_size=10), json_values, max_size=3).map(
        lambda d: json.dumps({"Records": d}).encode()
    ),
    st.builds(lambda k, b: body(event(key=k, bucket=b)), wrong_types, st.text(max_size=5)),
    st.builds(lambda k, b: body(event(key=k, bucket=b)), st.text(max_size=5), wrong_types),
    st.lists(json_values.filter(lambda v: not isinstance(v, dict)), min_size=1, max_size=3).map(
        lambda r: body(*r)
    ),
)


def test_hostile_bodies_are_refused_and_nothing_is_enqueued(
    kubectl: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    delivery_cluster: StartCluster,
    tmp_path: Path,
) -> None:
    cluster = delivery_cluster("dir")
    replica = cluster.start("fuzzed", stats_interval_seconds="0.5")
    port = cluster.ports["fuzzed"]
    start_operator(ingest_url=f"http://127.0.0.1:{port}")
    topic = f"fuzz-{uuid.uuid4().hex[:8]}"
    queue = QueueName(namespace, topic)
    with RecordingHttpServer() as receiver:
        apply(
            kubectl,
            namespace,
            "Topic",
            topic,
            {
                "endpoint": {"http": {"url": receiver.url}},
                "persistent": True,
                "delivery": {"handoff": "sync", "shards": 3},
            },
        )
        condition(kubectl, namespace, "topic", topic)
        secret = kubectl.get("secret", f"{topic}-ingest-token", namespace)
        token = base64.b64decode(secret["data"]["token"]).decode()
        path = f"/v1/topics/{namespace}/{topic}/{token}"
        wait_until(
            lambda: post(port, path, b"{}", "application/json")[0],
            lambda status: status == 400,
            30,
            "the replica serves the Topic (and refuses an empty body)",
        )
        for _ in range(20):  # lazily loaded code and buffers, before the baseline
            post(port, path, HOSTILE[-4][1], "application/json")
        before = rss_mb(replica.process.pid)

        answers: dict[str, tuple[int, str]] = {}
        for what, data, content_type in HOSTILE:
            answers[what] = post(port, path, data, content_type)
        answers["over the limit, chunked"] = post(
            port, path, b'{"Records": [' + b" " * MAX_BODY + b"]}", "application/json", True
        )
        answers["wrong token"] = post(
            port, f"{path[: -len(token)]}x{token}", VALID, "application/json"
        )
        answers["no token"] = post(port, path[: -len(token)], VALID, "application/json")
        answers["unknown topic"] = post(
            port,
            f"/v1/topics/{namespace}/nope-{uuid.uuid4().hex}/{token}",
            VALID,
            "application/json",
        )
        answers["traversal"] = post(
            port,
            f"/v1/topics/{quote('../..', safe='')}/{quote('../etc', safe='')}/{token}",
            VALID,
            "application/json",
        )
        answers["huge topic name"] = post(
            port, f"/v1/topics/{namespace}/{'t' * 20_000}/{token}", VALID, "application/json"
        )
        expected = {
            **{what: 400 for what, _, _ in HOSTILE},
            "just over the limit": 413,
            "over the limit, chunked": 413,
            "wrong token": 403,
            "no token": 404,  # no route without a token segment
            "unknown topic": 404,
            "traversal": 404,
            "huge topic name": 400,  # aiohttp refuses a request line over 8190 bytes
        }
        wrong = {
            what: (answer, expected[what])
            for what, answer in answers.items()
            if answer[0] != expected[what]
        }
        assert not wrong, f"answers other than the refusal each should get: {wrong}"
        for what, _, _ in HOSTILE:
            status, text = answers[what]
            # What to fix, in words: the body, not just a code.
            assert ("expected JSON" if status == 400 else "too large") in text, (what, text)

        fuzzed: list[int] = []

        @settings(
            max_examples=300,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        @given(
            data=fuzzed_bodies, content_type=st.sampled_from(["application/json", "text/plain", ""])
        )
        def fuzz(data: bytes, content_type: str) -> None:
            status, text = post(port, path, data, content_type)
            fuzzed.append(status)
            assert status == 400, (data[:200], status, text[:200])

        fuzz()

        after = rss_mb(replica.process.pid)
        metrics = scrape(f"http://127.0.0.1:{port}/metrics")
        triggered = metrics.get(
            (
                "pubsub_event_triggered_total",
                frozenset({("namespace", namespace), ("topic", topic)}),
            )
        )
        store = LocalDirStore(
            Path(cluster.env["BUCKETNOTIFY_DELIVERY_STORE"].removeprefix("dir://"))
        )
        stats = asyncio.run(store.stats(queue, time.time()))
        refused_requests = {
            dict(labels)["code"]: value
            for (name, labels), value in metrics.items()
            if name == "bucketnotify_ingest_requests_total"
        }
        print(
            f"\ningest RSS {before:.1f} MB before, {after:.1f} MB after {len(answers)} hostile"
            f" and {len(fuzzed)} fuzzed requests (+{after - before:.1f} MB); answers by code:"
            f" {refused_requests}"
        )
        assert triggered in (None, 0.0), "events were counted as triggered"
        assert stats.entries == 0 and stats.reservations == 0, stats
        assert not receiver.received(), "something reached the endpoint"
        assert replica.process.poll() is None

        # The same store and endpoint take a valid event: the refusals above were not vacuous.
        assert post(port, path, VALID, "application/json")[0] == 200
        wait_until(receiver.received, bool, 30, "the valid event delivered")
